"""What isolation costs a correct implementation: the BatchNorm default sweep (108 cases, torch's
implementation) judged in this process and in a warm isolated worker, side by side (one group: read
the ratio); RMSNorm's large design cases (10^5 to 10^6 elements, tens of MB of inputs and outputs a
run) run once each, here and in the worker (what moving their arrays costs). A deterministic record's two runs of
each case, the second in the worker on the inputs it kept against the inputs sent again (what the rerun's crossing
cost). The worker's one-time start is measured on its own.

    pytest benchmarks/test_isolation_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import pytest

from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.core.errors import ImplError, Unsupported
from normcheck.engine import FAIL, judge
from normcheck.impls import resolve_impl
from normcheck.worlds.core import differing
from normcheck.worlds.workers import WorkerPool

SWEEP = default_sweep("batchnorm", narrowing=Narrowing(scans="without"))


@pytest.mark.parametrize("world", ["in-process", "isolated"])
def test_batchnorm_sweep(benchmark, workload, world):
    impl = resolve_impl("batchnorm", "torch", world)
    judge(SWEEP[0], impl)  # warm: the worker started, torch's first-call imports done
    benchmark.group = "batchnorm default sweep, torch"
    cases = workload(SWEEP)

    reports = benchmark(lambda: [judge(case, impl) for case in cases])
    assert not [r for r in reports if r.verdict == FAIL]


LARGE = [c for c in default_sweep("rmsnorm", narrowing=Narrowing(scans="without")) if c.numel >= 10**5]


@pytest.mark.parametrize("world", ["in-process", "isolated"])
def test_large_cases_runs(benchmark, workload, world):
    impl = resolve_impl("rmsnorm", "torch", world, timeout=600.0)  # (a fixed limit: no reference computed)
    large = workload(LARGE)
    inputs = {case: case.make_inputs() for case in large}
    impl.runner(large[0], inputs[large[0]])
    benchmark.group = "rmsnorm large design cases, torch: one run each"

    outputs = benchmark(lambda: [impl.runner(case, inputs[case])[0] for case in large])
    assert len(LARGE) >= 5 and all(o["y"].shape == case.shape for o, case in zip(outputs, large))


@pytest.mark.parametrize("rerun", ["inputs sent again", "in the worker"])
def test_determinism_rerun(benchmark, rerun):
    """The two runs of every case of the add + LayerNorm design (torch's record, inputs made beforehand): the second
    one as a run of its own, inputs sent and outputs returned again, or the worker's run of the case it kept."""
    if benchmark.disabled:
        pytest.skip("279 cases twice per parameter (3 s); run with --benchmark-enable (tests/test_modes.py and "
                    "tests/test_compare.py run the worker's rerun)")
    impl = resolve_impl("add_layernorm", "torch", timeout=600.0)
    cases = default_sweep("add_layernorm", narrowing=Narrowing(scans="without"))
    inputs = {case: case.make_inputs() for case in cases}
    impl.runner(cases[0], inputs[cases[0]])
    benchmark.group = "add_layernorm design, torch: each case run twice"

    def twice(case):
        try:
            if rerun == "in the worker":
                return impl.runner(case, inputs[case], 2).differ
            first = impl.runner(case, inputs[case]).outputs
            return differing(first, impl.runner(case, inputs[case]).outputs)
        except (ImplError, Unsupported):  # (a case torch's kernel raises on or declines: the same either way)
            return ()

    differ = benchmark.pedantic(lambda: [twice(case) for case in cases], rounds=3, warmup_rounds=0)
    assert not any(differ)


def test_worker_start(benchmark):
    """A fresh isolated worker: fork from the warm fork server, ready to serve (a restart's cost)."""
    benchmark.group = "isolated worker start"

    def start_and_close():
        pool = WorkerPool(1, group=False, name="bench").start()
        pool.close()

    benchmark.pedantic(start_and_close, rounds=5, warmup_rounds=1)
