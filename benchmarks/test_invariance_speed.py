"""What --check batch-invariance costs: torch's LayerNorm and RMSNorm default sweeps judged with and without it, side
by side (one group per op: read the ratio of the two rows). Each case is judged as a CLI run judges it (reference,
bounds and baseline computed afresh, the determinism rerun included); the check reruns the implementation on the
case's rows in three other batches, the largest past 1024 rows and 2**20 elements.

    pytest benchmarks/test_invariance_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import pytest

from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL
from normcheck.impls import resolve_impl
from normcheck.ops.core import BATCH_INVARIANCE


@pytest.mark.parametrize("check", ["plain sweep", "--check batch-invariance"])
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_default_sweep_with_and_without_the_check(benchmark, judged_sweep, op, check):
    if benchmark.disabled:
        pytest.skip("a whole sweep per parameter (7-35 s); run with --benchmark-enable (tests/test_batch_invariance.py "
                    "checks what the check finds)")
    impl = resolve_impl(op, "torch")
    if check != "plain sweep":
        impl = impl.checking([BATCH_INVARIANCE])
    reports = judged_sweep(impl, default_sweep(op, follows=impl.impl.follows), f"{op}: default sweep on torch", rounds=1)
    assert not [r.summary() for r in reports if r.verdict == FAIL]
