"""Template over the implementation catalogue (IMPLS): every registered implementation, in its own
world, over its op's default sweep. Correct ones fail no case; the recipes that are wrong by design
fail exactly where their design says, and nowhere else.
"""
from __future__ import annotations

import pytest

from normcheck import IMPLS, compare, resolve_impl
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, PASS

# (op, impl) -> (why it fails, the tensors it may fail on (None: any), where it may fail)
WRONG_BY_DESIGN = {
    ("syncbn", "pre15"): ("averages per-rank means over the world size: wrong on uneven splits",
                          None, lambda c: len(set(c.split)) > 1),
    ("syncbn", "inplace-abn"): ("recomputes x from y: y's rounding divided by γ enters dγ at half precision",
                                {"dweight"}, lambda c: c.dtype in ("f16", "bf16")),
}
# (The baseline is left out: judged against itself it passes by construction; tests/test_tolerance.py judges it
# by the formula bound alone.)
ALL = [(op, name) for op, impls in IMPLS.items() for name in impls if name != "baseline"]


@pytest.mark.parametrize("op, name", ALL, ids=[f"{op}-{name}" for op, name in ALL])
def test_default_sweep(op, name):
    impl = resolve_impl(op, name)
    reports = [compare(op, impl, case) for case in default_sweep(op)]
    assert any(r.verdict == PASS for r in reports), f"{op}/{name}: no case passed"
    failing = [r for r in reports if r.verdict == FAIL]
    if (op, name) not in WRONG_BY_DESIGN:
        assert not failing, [f"{r.case.label}: {r.summary()}" for r in failing[:5]]
        return
    _, tensors, where = WRONG_BY_DESIGN[(op, name)]
    assert failing, f"{op}/{name} is wrong by design but passed its whole default sweep"
    for r in failing:
        failed = {t.name.split("[")[0] for t in r.tensors if t.verdict == FAIL}
        assert where(r.case) and (tensors is None or failed <= tensors), r.summary()

