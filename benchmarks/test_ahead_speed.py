"""What preparing the next case while the implementation runs the current one saves (engine.compare.ahead, the CLI's
loop): a sweep judged one case after another, and the same sweep with each case's inputs, reference, bounds and
baseline computed in a thread of its own while the case before it runs in the implementation's worker process, side
by side (one group per op: read the ratio of the two rows). On two idle cores the prepared sweep takes about the
time of the slower of the two halves, not of both.

    pytest benchmarks/test_ahead_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import pytest

from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL
from normcheck.impls import resolve_impl


@pytest.mark.parametrize("prepared", [False, True], ids=["one after another", "next case prepared ahead"])
@pytest.mark.parametrize("op", ["layernorm", "batchnorm", "groupnorm"])
def test_default_sweep_with_the_next_case_prepared_ahead(benchmark, judged_sweep, op, prepared):
    if benchmark.disabled:
        pytest.skip("a whole sweep per parameter (10-20 s); run with --benchmark-enable (tests/test_cli.py runs the "
                    "CLI's prepared loop)")
    impl = resolve_impl(op)
    reports = judged_sweep(impl, default_sweep(op, follows=impl.impl.follows), f"{op}: default sweep on {impl.name}",
                           rounds=1, prepared=prepared)
    assert not [r.summary() for r in reports if r.verdict == FAIL]
