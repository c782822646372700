"""Benchmark setup: single-threaded numerics, and a ratio summary at the end of the run.

NumPy's OpenBLAS (used by ``np.vecdot``) fixes its thread count when NumPy is first imported,
so ``OPENBLAS_NUM_THREADS=1`` is set here -- only when the session runs nothing but these
benchmarks (``pytest benchmarks/``) and NumPy is not loaded yet, so a combined run never
changes the environment of other tests.  torch (MKL + OpenMP here, no OpenBLAS) is pinned
with ``torch.set_num_threads(1)`` by the benchmark module, and restored afterwards.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_SINGLE_THREAD_BLAS = False


def _inside_here(arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == _HERE or _HERE in path.parents


def pytest_configure(config):
    global _SINGLE_THREAD_BLAS
    if config.args and all(_inside_here(a) for a in config.args) and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        _SINGLE_THREAD_BLAS = os.environ["OPENBLAS_NUM_THREADS"] == "1"


_MEDIANS = pytest.StashKey[dict]()

# A body run once under --benchmark-disable (the gate) checks that its code runs and its assertions hold; it does so on
# the first few of its cases, not on the whole workload a timing needs (tests/ judge those sweeps in full)
SMOKE_CASES = 6


@pytest.fixture
def workload(benchmark):
    """``workload(cases)``: the cases a benchmark times, every one when it times them and the first SMOKE_CASES when
    the run only checks that the benchmark works."""
    return lambda cases: list(cases) if not benchmark.disabled else list(cases)[:SMOKE_CASES]


@pytest.fixture
def record_median(request):
    """``record_median(benchmark, group, role)``: keep the median for the ratio summary.

    Does nothing when benchmarking is disabled (``--benchmark-disable`` runs each body once).
    """
    medians = request.config.stash.setdefault(_MEDIANS, {})

    def record(benchmark, group: str, role: str) -> None:
        meta = getattr(benchmark, "stats", None)
        if meta is not None:
            medians[(group, role)] = meta.stats.median

    return record


@pytest.fixture
def judged_sweep(benchmark):
    """``judged_sweep(impl, cases, group, rounds[, prepared])``: the reports of `cases` judged as a CLI run judges them
    (reference, bounds and baseline computed afresh each round), timed by pytest-benchmark in `group` after one warm-up
    case (the worker or world started, the framework's first-call imports done)."""
    from normcheck.engine import judge
    from normcheck.engine.compare import forget_cases

    from normcheck.engine.compare import ahead

    def timed(impl, cases, group: str, rounds: int, prepared: bool = False):
        """`prepared`: each case's inputs and expectations computed while the case before it runs (as the CLI does)."""
        judge(cases[0], impl)
        benchmark.group = group
        benchmark.extra_info["cases"] = len(cases)

        def sweep():
            forget_cases()
            return [judge(case, impl) for case in (ahead(cases) if prepared else cases)]

        return benchmark.pedantic(sweep, rounds=rounds, iterations=1)

    return timed


def pytest_terminal_summary(terminalreporter, config):
    medians = config.stash.get(_MEDIANS, {})
    if not medians:
        return
    tr = terminalreporter
    tr.section("reference speed ratios (medians)")
    if not _SINGLE_THREAD_BLAS:
        tr.write_line("note: OPENBLAS_NUM_THREADS=1 was not applied (run `pytest benchmarks/` "
                      "alone for single-threaded numbers)")
    tr.write_line(f"{'group':<28}{'reference':>12}{'torch':>12}{'stream':>12}{'stream+alloc':>14}"
                  f"{'torch/ref':>11}{'ref/stream':>12}{'ref/stream+alloc':>18}")
    for group in sorted({g for g, _ in medians}):
        m = {role: medians.get((group, role)) for role in ("reference", "torch", "stream", "stream_alloc")}
        ms = lambda v: f"{v * 1e3:.2f} ms" if v else "-"
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
        tr.write_line(
            f"{group:<28}{ms(m['reference']):>12}{ms(m['torch']):>12}{ms(m['stream']):>12}"
            f"{ms(m['stream_alloc']):>14}{ratio(m['torch'], m['reference']):>11}"
            f"{ratio(m['reference'], m['stream']):>12}{ratio(m['reference'], m['stream_alloc']):>18}"
        )
    tr.write_line("targets: torch/ref >= 2x; ref/stream <= 3x (stream = read x, dy + write y, dx "
                  "into preallocated arrays; stream+alloc = the same into fresh arrays)")
