"""What the boundary scans cost: each op's default sweep judged on its default implementation (what `normcheck
compare --op OP` runs: torch's record, or the parallel ops' textbook record) without the scans and with them, side by side (one group per op: read the ratio of the two rows,
and the difference of their medians: the seconds the scans add). Each case is judged as a CLI run judges it
(reference, bounds and baseline computed afresh, the determinism rerun included).

    pytest benchmarks/test_scans_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import pytest

from normcheck import OPS
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL
from normcheck.impls import resolve_impl


@pytest.mark.parametrize("scans", ["without", "with"])
@pytest.mark.parametrize("op", list(OPS))
def test_default_sweep_with_and_without_the_scans(benchmark, judged_sweep, op, scans):
    if benchmark.disabled:
        pytest.skip("a whole sweep per parameter (1-15 s); run with --benchmark-enable (tests/meta/test_scans.py "
                    "checks what the scans are)")
    impl = resolve_impl(op)
    cases = default_sweep(op, follows=impl.impl.follows, shares=impl.impl.shares, narrowing=Narrowing(scans=scans))
    reports = judged_sweep(impl, cases, f"{op}: default sweep on {impl.name}", rounds=1)
    assert not [r.summary() for r in reports if r.verdict == FAIL]
