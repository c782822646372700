"""What coverage that survives an implementation's limits costs (impls.limits, engine.coverage): a once-differentiable
LayerNorm kernel without a jvp (tests/_limited_impls.py) on the covering design's cases, side by side:

* before: the design as it is, its order-2, fwd and fwd-rev cases skipped (their cost is nil: only its order-1 cases
  are judged), as every run was before its limits narrowed the design;
* after: the design narrowed to what it takes (order 1), every case judged;
* torch's record on the whole design (what a kernel that does everything costs);
* probing alone: what the run spends learning the limits (a tiny case per level), beside one case.

One group: read the ratios. Each case is judged as a CLI run judges it (reference, bounds and baseline afresh).

    pytest benchmarks/test_limits_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import pytest

from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL
from normcheck.impls import resolve_impl
from normcheck.impls.limits import learned
from normcheck.ops import get_op

OP, KERNEL = "layernorm", "tests._limited_impls:once_differentiable_layer_norm"
DESIGN = Narrowing(scans="without")
GROUP = f"{OP}: a once-differentiable kernel's sweep"


def sweep(which: str):
    if which == "torch, whole design":
        return resolve_impl(OP, "torch"), default_sweep(OP, narrowing=DESIGN)
    impl = resolve_impl(OP, KERNEL)
    if which == "before: design, orders it cannot do skipped":
        return impl, [c for c in default_sweep(OP, narrowing=DESIGN) if c.order == 1]
    return impl, default_sweep(OP, narrowing=learned(get_op(OP), impl, DESIGN))


@pytest.mark.parametrize("which", ["before: design, orders it cannot do skipped", "after: narrowed design",
                                   "torch, whole design"])
def test_sweep(benchmark, judged_sweep, which):
    if benchmark.disabled:
        pytest.skip("a whole sweep per parameter (10-20 s); run with --benchmark-enable (tests/test_judged_coverage.py "
                    "judges the narrowed sweep)")
    impl, cases = sweep(which)
    reports = judged_sweep(impl, cases, GROUP, rounds=2)
    assert not [r for r in reports if r.verdict == FAIL]


def test_probing(benchmark):
    """The probes alone (the worker already started): a fraction of a second, against the sweep's seconds."""
    impl = resolve_impl(OP, KERNEL)
    learned(get_op(OP), impl, DESIGN)  # (the worker started, its imports done)
    benchmark.group = GROUP
    narrowing = benchmark(learned, get_op(OP), impl, DESIGN)
    assert {lim.name for lim in narrowing.limits} == {"order"}
