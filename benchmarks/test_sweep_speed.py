"""What the covering design costs: each op's default sweep judged on torch's record, beside the sweep it replaced
(the rotated grid of 108 cases per op, 30 for SyncBN, kept as replay tokens in data/sweeps-before-design.json).
One group per op: read the ratio of the two. Each case is judged as a CLI run judges it (reference, bounds and
baseline computed afresh, the determinism rerun included).

    pytest benchmarks/test_sweep_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from normcheck.cases.sweep import default_sweep
from normcheck.cases.tokens import decode_case
from normcheck.engine import FAIL
from normcheck.impls import resolve_impl

BEFORE = json.loads((Path(__file__).parent / "data" / "sweeps-before-design.json").read_text())
OPS = list(BEFORE)


def sweep_of(op: str, design: str):
    return default_sweep(op) if design == "covering design" else [decode_case(t) for t in BEFORE[op]]


@pytest.mark.parametrize("design", ["rotated grid (before)", "covering design"])
@pytest.mark.parametrize("op", OPS)
def test_default_sweep_on_torch(benchmark, judged_sweep, op, design):
    if benchmark.disabled:
        pytest.skip("a whole sweep per parameter (7-25 s); run with --benchmark-enable (tests/test_impls.py judges "
                    "every sweep)")
    reports = judged_sweep(resolve_impl(op, "torch"), sweep_of(op, design), f"{op}: default sweep on torch", rounds=2)
    assert not [r for r in reports if r.verdict == FAIL]
