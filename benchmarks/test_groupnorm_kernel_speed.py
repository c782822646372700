"""Speed of normcheck's channels-last GroupNorm kernel next to torch's, forward + backward.

Per case, in the same run: torch (``aten.native_group_norm`` + ``aten.native_group_norm_backward``,
channels_last) and ours with strategy "groups" (parallel over N·G) and "pixels" (parallel over N·HxW),
at 1 and 2 threads, f32 and mixed bf16 (bf16 data, f32 γ/β):

    pytest benchmarks/test_groupnorm_kernel_speed.py --benchmark-enable -p no:cacheprovider --benchmark-group-by=group
    python benchmarks/test_groupnorm_kernel_speed.py        # the ours/torch table of docs/benchmarks.md

Targets: ours >= 1.0x torch everywhere, >= 1.3x where N·G < threads.  No timing is asserted; each
body checks ours against torch on dy·γ-weighted outputs (loose: torch's channels-last statistics are
E[x²]−E[x]², ours two-pass), so the smoke run (``--benchmark-disable``, every body once) is a check too.
"""
from __future__ import annotations

import itertools
import time

import pytest
import torch

from normcheck.kernels import groupnorm as gn

aten = torch.ops.aten
EPS = 1e-5
CASES = {  # name: (shape, groups)
    "hw1024-N8-G32": ((8, 64, 32, 32), 32),      # HxW < 2048: torch parallel over N·G
    "hw4096-N2-G32": ((2, 64, 64, 64), 32),      # HxW >= 2048: torch parallel over N·HxW
    "hw1024-N1-G1": ((1, 64, 32, 32), 1),        # N·G = 1 < threads
    "hw4096-N1-G1": ((1, 32, 64, 64), 1),
}
DTYPES = {"f32": (torch.float32, torch.float32), "mixed-bf16": (torch.bfloat16, torch.float32)}
THREADS = (1, 2)


def make(shape, dtype):
    dt, pdt = DTYPES[dtype]
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) + 0.5).to(dt).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(shape, generator=g).to(dt).contiguous(memory_format=torch.channels_last)
    w = torch.rand(shape[1], generator=g).to(pdt) + 0.5
    b = torch.randn(shape[1], generator=g).to(pdt)
    return x, dy, w, b


def torch_step(x, dy, w, b, groups):
    n, c = x.shape[:2]
    hxw = x.numel() // (n * c)
    y, mean, rstd = aten.native_group_norm(x, w, b, n, c, hxw, groups, EPS)
    dx, dw, db = aten.native_group_norm_backward(dy, x, mean, rstd, w, n, c, hxw, groups, [True, True, True])
    return y, dx, dw, db


def ours_step(x, dy, w, b, groups, strategy):
    y, mean, rstd = gn.forward(x, groups, w, b, EPS, strategy=strategy)
    dx, dw, db = gn.backward(dy, x, mean, rstd, groups, w, strategy=strategy)
    return y, dx, dw, db


def runner(impl, groups):
    if impl == "torch":
        return lambda *a: torch_step(*a, groups)
    return lambda *a: ours_step(*a, groups, impl)


@pytest.fixture
def threads_set():
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


@pytest.mark.parametrize("impl", ["torch", "groups", "pixels"])
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_groupnorm_fwd_bwd(benchmark, threads_set, case, dtype, threads, impl):
    shape, groups = CASES[case]
    gn.load()
    threads_set(threads)
    args = make(shape, dtype)
    benchmark.group = f"gn {case} {dtype} t{threads}"
    out = benchmark(runner(impl, groups), *args)
    if impl != "torch":
        ref = torch_step(*args, groups)
        tol = 1e-3 if dtype == "f32" else 5e-2
        for got, want in zip(out, ref):
            err = (got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)
            assert err < tol, (case, dtype, impl, float(err))


def _time(fn, args, reps, rounds=30):
    """Best mean over `rounds` rounds of `reps` calls: on a shared machine the best round is the one
    nobody else ran in, for both sides alike."""
    fn(*args)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def table(reps: int = 10) -> str:
    gn.load()
    old = torch.get_num_threads()
    rows = ["| case (shape, G) | dtype | threads | torch ms | groups ms | pixels ms | auto | torch/ours (best) |",
            "|---|---|---|---|---|---|---|---|"]
    try:
        for (case, (shape, groups)), dtype, threads in itertools.product(CASES.items(), DTYPES, THREADS):
            torch.set_num_threads(threads)
            args = make(shape, dtype)
            ms = {impl: 1e3 * _time(runner(impl, groups), args, reps) for impl in ("torch", "groups", "pixels")}
            gn.forward(*args[:1], groups, *args[2:], strategy="auto")
            auto = gn.last_forward_path().split("/")[0]  # the kernel's own choice
            best = min(ms["groups"], ms["pixels"])
            rows.append(f"| {case} {shape} | {dtype} | {threads} | {ms['torch']:.3f} | {ms['groups']:.3f} | "
                        f"{ms['pixels']:.3f} | {auto} {ms['torch'] / ms[auto]:.2f}x | {ms['torch'] / best:.2f}x |")
    finally:
        torch.set_num_threads(old)
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
