"""What isolation costs a correct implementation: the BatchNorm default sweep (108 cases, torch's
implementation) judged in this process and in a warm isolated worker, side by side (one group: read
the ratio); RMSNorm's large design cases (10^5 to 10^6 elements, tens of MB of inputs and outputs a
run) run once each, here and in the worker (what moving their arrays costs). The worker's one-time
start is measured on its own.

    pytest benchmarks/test_isolation_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import pytest

from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, judge
from normcheck.impls import resolve_impl
from normcheck.worlds.workers import WorkerPool

SWEEP = default_sweep("batchnorm", narrowing=Narrowing(scans="without"))


@pytest.mark.parametrize("world", ["in-process", "isolated"])
def test_batchnorm_sweep(benchmark, world):
    impl = resolve_impl("batchnorm", "torch", world)
    judge(SWEEP[0], impl)  # warm: the worker started, torch's first-call imports done
    benchmark.group = "batchnorm default sweep, torch"

    reports = benchmark(lambda: [judge(case, impl) for case in SWEEP])
    assert not [r for r in reports if r.verdict == FAIL]


LARGE = [c for c in default_sweep("rmsnorm", narrowing=Narrowing(scans="without")) if c.numel >= 10**5]


@pytest.mark.parametrize("world", ["in-process", "isolated"])
def test_large_cases_runs(benchmark, world):
    impl = resolve_impl("rmsnorm", "torch", world, timeout=600.0)  # (a fixed limit: no reference computed)
    inputs = {case: case.make_inputs() for case in LARGE}
    impl.runner(LARGE[0], inputs[LARGE[0]])
    benchmark.group = "rmsnorm large design cases, torch: one run each"

    outputs = benchmark(lambda: [impl.runner(case, inputs[case])[0] for case in LARGE])
    assert len(LARGE) >= 5 and all(o["y"].shape == case.shape for o, case in zip(outputs, LARGE))


def test_worker_start(benchmark):
    """A fresh isolated worker: fork from the warm fork server, ready to serve (a restart's cost)."""
    benchmark.group = "isolated worker start"

    def start_and_close():
        pool = WorkerPool(1, group=False, name="bench").start()
        pool.close()

    benchmark.pedantic(start_and_close, rounds=5, warmup_rounds=1)
