"""What the checks beyond one first-order backward cost: the BatchNorm default sweep's f64 and f32 cases (36, every
profile, size and layout; torch's implementation, isolated worker) judged with its determinism rerun and without (a record that declares itself
nondeterministic runs once), side by side; and one order-2 case against the same case at order 1. One group
each: read the ratios.

    pytest benchmarks/test_paths_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from normcheck import IMPLS, Case
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, judge
from normcheck.engine.compare import forget_cases
from normcheck.impls import resolve_impl

SWEEP = [c for c in default_sweep("batchnorm", narrowing=Narrowing(scans="without")) if c.dtype in ("f64", "f32")]


@pytest.mark.parametrize("runs", ["twice (deterministic)", "once"])
def test_batchnorm_sweep(benchmark, workload, runs):
    impl = resolve_impl("batchnorm", replace(IMPLS["batchnorm"]["torch"], deterministic=runs != "once"))
    judge(SWEEP[0], impl)  # warm: the worker started, torch's first-call imports done
    benchmark.group = "batchnorm default sweep, torch: determinism rerun"
    cases = workload(SWEEP)

    def sweep():
        forget_cases()  # (each round computes every case's reference afresh, as a CLI run does)
        return [judge(case, impl) for case in cases]

    reports = benchmark(sweep)
    assert not [r for r in reports if r.verdict == FAIL]


@pytest.mark.parametrize("order", [1, 2])
def test_one_large_case(benchmark, order):
    """A LayerNorm case of 65537 rows (393k elements): what the double backward adds to judging it."""
    case = Case("layernorm", (65537, 6), "f32", normalized_dims=1, order=order)
    impl = resolve_impl("layernorm", "torch")
    judge(case, impl)
    benchmark.group = "layernorm 65537x6, torch: order 1 against order 2"

    def once():
        forget_cases()
        return judge(case, impl)

    assert benchmark(once).verdict != FAIL
