"""Speed of the SyncBN CPU primitives (world size 1) next to torch's fused CPU batch norm.

Single-threaded torch, float32, same inputs, side by side per case
(``pytest benchmarks/test_syncbn_primitives_speed.py --benchmark-enable -p no:cacheprovider
--benchmark-group-by=group``):

* ``bwd``: ``aten.native_batch_norm_backward`` (torch's fused CPU kernel, all three gradients)
  vs ``batch_norm_backward_reduce`` + ``batch_norm_backward_elemt`` (ours), both from the same
  saved mean / invstd;
* ``fwd``: ``aten.native_batch_norm`` (training, running stats) vs ``batch_norm_stats`` +
  ``batch_norm_gather_stats_with_counts`` (one rank) + ``batch_norm_elemt`` (ours).

Target: ours within 1.25x of torch's time for the backward.  No timing is asserted; each body
checks that the two agree (norm-wise relative error <= 1e-5, float32), so the smoke run
(``--benchmark-disable``: every body once) is also a correctness check.  With benchmarking on,
the module ends by printing the ours/torch ratios of the medians and of the minima.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from normcheck.kernels.syncbn import cpu_primitives

cpu_primitives.register()  # torch's SyncBN primitives get CPU kernels (a SyncBN world does this too)

aten = torch.ops.aten
EPS = 1e-5
MOMENTUM = 0.1
RTOL = 1e-5  # float32 vs float32, different summation orders over 25088 values per channel
SHAPE = (32, 64, 28, 28)
FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@dataclass
class Inputs:
    name: str
    fmt: torch.memory_format
    x: torch.Tensor
    dy: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    mean: torch.Tensor  # torch's saved statistics, the input of both backwards
    invstd: torch.Tensor


@pytest.fixture(scope="module", autouse=True)
def _torch_single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(FORMATS))
def inputs(request) -> Inputs:
    g = torch.Generator().manual_seed(0)
    fmt = FORMATS[request.param]
    x = (torch.randn(SHAPE, generator=g) * 2.0 + 0.5).contiguous(memory_format=fmt)
    dy = torch.randn(SHAPE, generator=g).contiguous(memory_format=fmt)
    c = SHAPE[1]
    w, b = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    _, mean, invstd = aten.native_batch_norm(x, w, b, None, None, True, MOMENTUM, EPS)
    name = "x".join(map(str, SHAPE)) + f" f32 {request.param}"
    return Inputs(name, fmt, x, dy, w, b, mean, invstd)


_MEDIANS: dict[tuple[str, str, str], tuple[float, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _ratio_summary(request):
    yield
    if not _MEDIANS:
        return
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["", "SyncBN CPU primitives, ours / torch (target for bwd: <= 1.25x)"]
    lines.append(f"{'case':<40}{'torch med':>11}{'ours med':>11}{'ratio med':>11}{'ratio min':>11}")
    for (phase, name) in sorted({(p, n) for p, n, _ in _MEDIANS}):
        t = _MEDIANS.get((phase, name, "torch"))
        o = _MEDIANS.get((phase, name, "ours"))
        if t and o:
            lines.append(f"{phase + ' ' + name:<40}{t[0] * 1e3:>9.3f}ms{o[0] * 1e3:>9.3f}ms"
                         f"{o[0] / t[0]:>10.2f}x{o[1] / t[1]:>10.2f}x")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled():  # fd capture would swallow a teardown's output
        for line in lines:
            tr.write_line(line) if tr is not None else print(line)


def _record(benchmark, phase: str, name: str, role: str) -> None:
    meta = getattr(benchmark, "stats", None)
    if meta is not None:
        _MEDIANS[(phase, name, role)] = (meta.stats.median, meta.stats.min)


def _rel(a: torch.Tensor, e: torch.Tensor) -> float:
    a, e = a.double(), e.double()
    return float((a - e).abs().max() / e.abs().max())


def _assert_match(got: dict, expected: dict) -> None:
    for key, e in expected.items():
        err = _rel(got[key], e)
        assert err <= RTOL, f"{key}: norm-wise relative error {err:.2e} > {RTOL:.0e}"


# ------------------------------------------------------------------------------ backward


def _torch_backward(i: Inputs) -> dict:
    dx, dw, db = aten.native_batch_norm_backward(
        i.dy, i.x, i.w, None, None, i.mean, i.invstd, True, EPS, [True, True, True]
    )
    return {"dx": dx, "dweight": dw, "dbias": db}


def _our_backward(i: Inputs, count: torch.Tensor) -> dict:
    sum_dy, sum_dy_xmu, dw, db = torch.batch_norm_backward_reduce(i.dy, i.x, i.mean, i.invstd, i.w, True, True, True)
    dx = torch.batch_norm_backward_elemt(i.dy, i.x, i.mean, i.invstd, i.w, sum_dy, sum_dy_xmu, count)
    return {"dx": dx, "dweight": dw, "dbias": db}


@pytest.mark.parametrize("impl", ["torch", "ours"])
def test_backward(benchmark, inputs, impl):
    benchmark.group = f"bwd {inputs.name}"
    count = torch.tensor([[inputs.x.numel() // inputs.x.shape[1]]], dtype=torch.int32)
    if impl == "torch":
        got = benchmark(_torch_backward, inputs)
        _assert_match(got, _our_backward(inputs, count))
    else:
        got = benchmark(_our_backward, inputs, count)
        _assert_match(got, _torch_backward(inputs))
        assert got["dx"].is_contiguous(memory_format=inputs.fmt)
    _record(benchmark, "bwd", inputs.name, impl)


# ------------------------------------------------------------------------------- forward


def _torch_forward(i: Inputs, rm: torch.Tensor, rv: torch.Tensor) -> dict:
    y, mean, invstd = aten.native_batch_norm(i.x, i.w, i.b, rm, rv, True, MOMENTUM, EPS)
    return {"y": y, "mean": mean, "invstd": invstd}


def _our_forward(i: Inputs, rm: torch.Tensor, rv: torch.Tensor, count: torch.Tensor) -> dict:
    mean, invstd = torch.batch_norm_stats(i.x, EPS)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        i.x, mean[None], invstd[None], rm, rv, MOMENTUM, EPS, count
    )
    return {"y": torch.batch_norm_elemt(i.x, i.w, i.b, mean, invstd, EPS), "mean": mean, "invstd": invstd}


@pytest.mark.parametrize("impl", ["torch", "ours"])
def test_forward(benchmark, inputs, impl):
    benchmark.group = f"fwd {inputs.name}"
    c = inputs.x.shape[1]
    rm, rv = torch.zeros(c), torch.ones(c)
    count = torch.tensor([float(inputs.x.numel() // c)])
    if impl == "torch":
        got = benchmark(_torch_forward, inputs, rm, rv)
        _assert_match(got, _our_forward(inputs, rm.clone(), rv.clone(), count))
    else:
        got = benchmark(_our_forward, inputs, rm, rv, count)
        _assert_match(got, _torch_forward(inputs, rm.clone(), rv.clone()))
    _record(benchmark, "fwd", inputs.name, impl)
