"""The expectations cache (normcheck.core.caching): bounded by the bytes of the arrays it keeps, least recently used
evicted first, the latest entry always kept; what the engine caches a case's inputs and expectations with."""
from __future__ import annotations

import numpy as np

from normcheck.cases import Case
from normcheck.core.caching import cache_by_bytes, nbytes
from normcheck.engine.compare import case_inputs, expectations, forget_cases, reference, yardsticks
from normcheck.engine.tolerance import CONSTANTS


def test_arrays_are_counted_inside_dicts_tuples_and_dataclasses():
    inputs = Case("layernorm", (4, 8), "f32").make_inputs()
    assert nbytes(inputs) >= inputs.x.nbytes + inputs.dy.nbytes > 0
    assert nbytes(({"a": np.zeros(3)}, [np.zeros(2, np.float32)], 1.5, "text")) == 24 + 8


def test_the_least_recently_used_goes_first_and_the_latest_stays_however_large():
    calls = []

    @cache_by_bytes(100)
    def make(n):
        calls.append(n)
        return np.zeros(n, np.uint8)

    make(40), make(40), make(50)  # 90 bytes: both kept
    assert calls == [40, 50]
    make(40)                       # used again: 50 is now the least recent
    make(30)                       # 120 bytes: 50 goes
    make(40), make(30)
    assert calls == [40, 50, 30]
    make(50)
    assert calls == [40, 50, 30, 50]
    make(500)                      # over the budget alone: kept, everything else goes
    make(500)
    assert calls[-1] == 500 and calls.count(500) == 1
    make(40)
    assert calls[-1] == 40
    make.cache_clear()
    make(40)
    assert calls[-2:] == [40, 40]


def test_a_case_met_again_gets_the_same_inputs_and_expectations_back():
    first, second = Case("rmsnorm", (3, 16), "f32"), Case("rmsnorm", (3, 16), "bf16")
    inputs, expected = case_inputs(first), expectations(first, CONSTANTS)
    case_inputs(second), expectations(second, CONSTANTS)
    assert case_inputs(first) is inputs and expectations(first, CONSTANTS) is expected


def test_forgetting_the_cases_computes_everything_afresh():
    """After forget_cases nothing of a case is served from a cache: its inputs, reference, expectations and
    yardsticks are new objects (a benchmark round that kept one would time less than a run does)."""
    case = Case("layernorm", (4, 8), "f32")
    kept = [case_inputs(case), reference(case), expectations(case, CONSTANTS), yardsticks(case, CONSTANTS)]
    forget_cases()
    again = [case_inputs(case), reference(case), expectations(case, CONSTANTS), yardsticks(case, CONSTANTS)]
    assert [a is b for a, b in zip(kept, again)] == [False] * 4
