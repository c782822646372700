"""CPU kernels for the aten SyncBN primitives (normcheck.kernels.syncbn.cpu_primitives).

* each primitive, composed into SyncBN forward + backward (stats -> gather_stats_with_counts ->
  elemt; backward_reduce -> all-reduce -> backward_elemt), against the float64 reference run on
  the same (quantised) inputs: world size 1 and world size 3 with uneven splits and an empty
  rank; f64 / f32 / bf16 / f16 and bf16 / f16 input with f32 parameters; 2-D to 5-D; contiguous,
  channels_last, channels_last_3d and non-dense strided inputs;
* against torch's CPU batch norm (F.batch_norm training + autograd) at world size 1;
* statistics without cancellation on offset data (|mean| = 1e4 * std) where E[x^2] - E[x]^2 fails;
* torch's own ``torch.nn.modules._functions.SyncBatchNorm`` under a real gloo group of size 1;
* CUDA semantics in the corners: dtypes of every output, output memory format, int32 counts,
  undefined outputs for unset flags, empty input, count-0 ranks, eps = 0;
* registration: idempotent, and a CPU kernel that already exists is left alone.

Tolerances (norm-wise: max |error| / max |reference| per tensor):
* float64: 1e-12 -- only the summation order differs from the reference;
* float32: 1e-5 -- float32 accumulation over <= ~1e3 elements per channel (u*sqrt(M) ~ 1e-6)
  with a 10x margin;
* f16 / bf16 outputs: rounding the float32 result to the output dtype costs at most half an ulp
  of the largest element, 2**-12 (f16) / 2**-9 (bf16) of the max; tolerances 2**-10 / 2**-7 leave
  4x for the float32 arithmetic before it.  Outputs kept in float32 (mean, invstd, sums, and
  dweight / dbias with f32 parameters) are held to the float32 tolerance: that is the check that
  half inputs accumulate in float32.
"""

from __future__ import annotations

import importlib
import itertools
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normcheck.kernels.syncbn import cpu_primitives

cpu_primitives.register()
from normcheck.frameworks.torch import lay_out
from normcheck.reference import batch_norm_backward, batch_norm_forward

EPS = 1e-5
MOMENTUM = 0.1
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
RTOL = {F64: 1e-12, F32: 1e-5, F16: 2.0**-10, BF16: 2.0**-7}


def rel_err(actual: torch.Tensor, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected| (norm-wise), in float64."""
    a = actual.detach().to(F64).numpy()
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, (a.shape, e.shape)
    if e.size == 0:
        return 0.0
    top = np.max(np.abs(e))
    diff = np.max(np.abs(a - e))
    return float(diff / top) if top > 0 else float(diff)


def assert_close(name: str, actual: torch.Tensor, expected: np.ndarray, dtype: torch.dtype, ctx: str = "") -> None:
    err = rel_err(actual, expected)
    assert err <= RTOL[dtype], f"{name}: relative error {err:.3e} > {RTOL[dtype]:.1e} ({dtype}) {ctx}"


def np64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to(F64).numpy()


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return F64 if dtype == F64 else F32


# ------------------------------------------------------------------------------ inputs


@dataclass
class Inputs:
    x: torch.Tensor
    dy: torch.Tensor
    w: torch.Tensor | None
    b: torch.Tensor | None
    rm: torch.Tensor
    rv: torch.Tensor


def make_inputs(shape, dtype, fmt="contiguous", param_dtype=None, affine=True, seed=0, offset=0.0) -> Inputs:
    """x, dy in ``dtype`` and layout ``fmt``; weight, bias, running stats in ``param_dtype``."""
    param_dtype = param_dtype or dtype
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.randn(shape, generator=g, dtype=F64) * 1.5 + offset).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=F64).to(dtype)
    w = (torch.rand(c, generator=g, dtype=F64) + 0.5).to(param_dtype) if affine else None
    b = torch.randn(c, generator=g, dtype=F64).to(param_dtype) if affine else None
    rm = torch.randn(c, generator=g, dtype=F64).to(param_dtype)
    rv = (torch.rand(c, generator=g, dtype=F64) + 0.5).to(param_dtype)
    return Inputs(lay_out(x, fmt), lay_out(dy, fmt), w, b, rm, rv)


@dataclass
class SyncResult:
    y: torch.Tensor
    dx: torch.Tensor
    dweight: torch.Tensor | None
    dbias: torch.Tensor | None
    mean: torch.Tensor
    invstd: torch.Tensor


def sync_bn(inp: Inputs, splits: list[int]) -> SyncResult:
    """SyncBN forward + backward composed from the primitives, ranks = slices of the batch.

    What torch's Python SyncBatchNorm does per rank, in lockstep: local stats, all-gather,
    gather_stats_with_counts (running stats updated in place), elemt; backward_reduce,
    all-reduce of (sum_dy, sum_dy_xmu), backward_elemt with the int32 per-rank counts.  An empty
    rank sends its batch_norm_stats of an empty input (mean 0, invstd NaN) with count 0: the
    gather must ignore it.  Its backward_reduce (zero sums) joins the all-reduce.
    """
    x, dy, w, b = inp.x, inp.dy, inp.w, inp.b
    assert sum(splits) == x.shape[0]
    bounds = list(itertools.pairwise(np.cumsum([0, *splits])))
    xs = [x[lo:hi] for lo, hi in bounds]
    dys = [dy[lo:hi] for lo, hi in bounds]
    per_rank = [x_r.numel() // x.shape[1] for x_r in xs]

    stats = [torch.batch_norm_stats(x_r, EPS) for x_r in xs]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = torch.tensor(per_rank, dtype=inp.rm.dtype)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, mean_all, invstd_all, inp.rm, inp.rv, MOMENTUM, EPS, counts
    )
    y = torch.cat([torch.batch_norm_elemt(x_r, w, b, mean, invstd, EPS) for x_r in xs])

    reduced = [
        torch.batch_norm_backward_reduce(dy_r, x_r, mean, invstd, w, True, w is not None, b is not None)
        for dy_r, x_r in zip(dys, xs)
    ]
    sum_dy = torch.stack([r[0] for r in reduced]).sum(0)  # the all-reduce
    sum_dy_xmu = torch.stack([r[1] for r in reduced]).sum(0)
    count = torch.tensor(per_rank, dtype=torch.int32).view(-1, 1)  # count_all.to(int32), (W, 1)
    w_acc = None if w is None else w.to(mean.dtype)  # torch's SyncBN: weight.to(mean.dtype)
    dx = torch.cat(
        [
            torch.batch_norm_backward_elemt(dy_r, x_r, mean, invstd, w_acc, sum_dy, sum_dy_xmu, count)
            for dy_r, x_r in zip(dys, xs)
        ]
    )
    dweight = None if w is None else torch.stack([r[2] for r in reduced]).sum(0)
    dbias = None if b is None else torch.stack([r[3] for r in reduced]).sum(0)
    return SyncResult(y, dx, dweight, dbias, mean, invstd)


def check_against_reference(inp: Inputs, splits: list[int], ctx: str) -> None:
    dtype = inp.x.dtype
    pdtype = inp.rm.dtype
    rm0, rv0 = inp.rm.clone(), inp.rv.clone()
    got = sync_bn(inp, splits)
    fwd = batch_norm_forward(np64(inp.x), np64(inp.w), np64(inp.b), np64(rm0), np64(rv0), MOMENTUM, EPS)
    bwd = batch_norm_backward(np64(inp.dy), np64(inp.x), np64(inp.w), EPS, has_bias=inp.b is not None)
    acc = acc_dtype(dtype)

    assert got.mean.dtype == acc and got.invstd.dtype == acc, ctx
    assert_close("mean", got.mean, fwd.mean, acc, ctx)
    assert_close("invstd", got.invstd, fwd.invstd, acc, ctx)
    assert got.y.dtype == dtype and got.dx.dtype == dtype, ctx
    assert_close("y", got.y, fwd.y, dtype, ctx)
    assert_close("dx", got.dx, bwd.dx, dtype, ctx)
    assert_close("running_mean", inp.rm, fwd.running_mean, pdtype, ctx)
    assert_close("running_var", inp.rv, fwd.running_var, pdtype, ctx)
    if inp.w is not None:
        assert got.dweight.dtype == inp.w.dtype and got.dbias.dtype == inp.b.dtype, ctx
        assert_close("dweight", got.dweight, bwd.dweight, inp.w.dtype, ctx)
        assert_close("dbias", got.dbias, bwd.dbias, inp.b.dtype, ctx)
    else:
        assert got.dweight is None and got.dbias is None


# (input dtype, parameter dtype)
DTYPES = [(F64, F64), (F32, F32), (BF16, BF16), (F16, F16), (BF16, F32), (F16, F32)]
DTYPE_IDS = ["f64", "f32", "bf16", "f16", "bf16+f32", "f16+f32"]
SHAPES = [  # (shape, layout)
    ((24, 5), "contiguous"),
    ((4, 3, 7), "contiguous"),
    ((3, 4, 5, 6), "contiguous"),
    ((3, 4, 5, 6), "channels_last"),
    ((2, 3, 4, 3, 5), "contiguous"),
    ((2, 3, 4, 3, 5), "channels_last_3d"),
    ((3, 4, 5, 6), "strided"),
]
SHAPE_IDS = [f"{len(s)}d-{f}" for s, f in SHAPES]


@pytest.mark.parametrize("shape,fmt", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype,pdtype", DTYPES, ids=DTYPE_IDS)
def test_world_size_one_matches_reference(dtype, pdtype, shape, fmt):
    inp = make_inputs(shape, dtype, fmt, pdtype, seed=1)
    check_against_reference(inp, [shape[0]], f"W=1 {shape} {fmt}")


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
@pytest.mark.parametrize("shape,fmt", [SHAPES[1], SHAPES[3], SHAPES[5]], ids=[SHAPE_IDS[1], SHAPE_IDS[3], SHAPE_IDS[5]])
@pytest.mark.parametrize("dtype,pdtype", [DTYPES[0], DTYPES[1], DTYPES[4]], ids=["f64", "f32", "bf16+f32"])
def test_world_size_three_uneven_with_empty_rank_matches_reference(dtype, pdtype, shape, fmt, affine):
    n = 7
    inp = make_inputs((n,) + shape[1:], dtype, fmt, pdtype, affine=affine, seed=2)
    check_against_reference(inp, [3, 0, 4], f"W=3 splits 3/0/4 {fmt}")


def test_blocked_reductions_match_reference(monkeypatch):
    """Sets larger than one block (the reductions run block by block) and a ragged last block,
    cut along the batch and -- for a sample bigger than a block -- along dim 2."""
    monkeypatch.setattr(cpu_primitives, "_BLOCK", 50)
    for shape, fmt in [((7, 3, 4, 5), "channels_last"), ((2, 2, 9, 11), "contiguous"), ((30, 4), "contiguous")]:
        for dtype in (F64, F32):
            check_against_reference(make_inputs(shape, dtype, fmt, seed=3), [shape[0]], f"blocked {shape} {fmt}")


# ------------------------------------------------------------------ torch CPU batch norm


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
def test_world_size_one_matches_torch_batch_norm(dtype, fmt):
    inp = make_inputs((4, 6, 5, 7), dtype, fmt, seed=4)
    x = inp.x.clone().requires_grad_()
    w = inp.w.clone().requires_grad_()
    b = inp.b.clone().requires_grad_()
    rm, rv = inp.rm.clone(), inp.rv.clone()
    y_t = F.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS)
    dx_t, dw_t, db_t = torch.autograd.grad(y_t, (x, w, b), inp.dy)

    got = sync_bn(inp, [4])
    tol = RTOL[dtype]
    for name, a, e in [("y", got.y, y_t), ("dx", got.dx, dx_t), ("dweight", got.dweight, dw_t),
                       ("dbias", got.dbias, db_t), ("running_mean", inp.rm, rm), ("running_var", inp.rv, rv)]:
        err = rel_err(a, np64(e))
        assert err <= tol, f"{name}: {err:.3e} vs torch F.batch_norm > {tol:.0e}"
    if fmt == "channels_last":
        assert got.y.is_contiguous(memory_format=torch.channels_last)
        assert got.dx.is_contiguous(memory_format=torch.channels_last)


# -------------------------------------------------------------- statistics without cancellation


@pytest.mark.parametrize("fmt,shape", [("contiguous", (8, 3, 32, 32)), ("channels_last", (8, 3, 32, 32)),
                                       ("channels_last_3d", (4, 3, 4, 16, 16))])
def test_stats_of_offset_data_have_float32_accuracy(fmt, shape):
    """mean 1e4, std 1 in float32, 8192 values per channel.

    E[x^2] - E[x]^2 in float32 loses everything: E[x^2] ~ 1e8 has an ulp of 8, so the
    difference (the variance, ~1) is rounding noise -- checked below so the test can fail.  A
    two-pass / Welford variance is limited by float32 arithmetic on x - mean (~1e-7 relative);
    the bound 1e-5 leaves 100x.  The mean must be within 2 ulps of 1e4 (ulp = 2**-10).
    """
    g = torch.Generator().manual_seed(5)
    x = lay_out((torch.randn(shape, generator=g, dtype=F64) + 1e4).to(F32), fmt)
    ref = batch_norm_forward(np64(x), eps=0.0)
    ref_var = 1.0 / ref.invstd**2

    mean, invstd = torch.batch_norm_stats(x, 0.0)
    var = 1.0 / invstd.to(F64).numpy() ** 2
    assert np.max(np.abs(var - ref_var) / ref_var) < 1e-5
    assert np.max(np.abs(mean.to(F64).numpy() - ref.mean)) <= 2 * 2.0**-10

    dims = (0,) + tuple(range(2, x.dim()))
    naive = (x * x).mean(dims) - x.mean(dims) ** 2
    assert np.max(np.abs(naive.to(F64).numpy() - ref_var) / ref_var) > 0.5  # the formula we avoid


def test_gather_of_offset_ranks_keeps_accuracy():
    """Three ranks with offsets 1e4, 1e4 + 3, 1e4 - 2 and std 1 (float32).

    The gathered variance is dominated by the between-rank spread.  The primitives pass each
    rank's mean rounded to float32 (error d_r <= 2**-11 at 1e4), which moves the merged variance
    by up to sum_r n_r/n * (2|mean_r - mean| d_r + d_r**2); the merge itself must add nothing
    beyond float32 rounding: (1) against the exact merge of the per-rank values it was given,
    1e-6; (2) against the full-batch reference, the bound above plus float32 rounding.
    """
    g = torch.Generator().manual_seed(6)
    parts = [(torch.randn(n, 2, 16, generator=g, dtype=F64) + off).to(F32)
             for n, off in [(5, 1e4), (9, 1e4 + 3), (2, 1e4 - 2)]]
    x = torch.cat(parts)
    stats = [torch.batch_norm_stats(p, EPS) for p in parts]
    n_r = np.array([p.numel() // 2 for p in parts], dtype=np.float64)[:, None]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, mean_all, invstd_all, None, None, MOMENTUM, EPS, torch.tensor(n_r[:, 0], dtype=F32)
    )
    var = 1.0 / invstd.to(F64).numpy() ** 2 - EPS

    m_r, var_r = mean_all.to(F64).numpy(), 1.0 / invstd_all.to(F64).numpy() ** 2 - EPS
    n = n_r.sum()
    merged_mean = (n_r * m_r).sum(0) / n
    merged_var = (n_r * (var_r + (m_r - merged_mean) ** 2)).sum(0) / n
    assert np.max(np.abs(var - merged_var) / merged_var) < 1e-6
    assert np.max(np.abs(mean.to(F64).numpy() - merged_mean) / merged_mean) < 1e-7

    ref = batch_norm_forward(np64(x), eps=EPS)
    ref_var = 1.0 / ref.invstd**2 - EPS
    exact_m_r = np.stack([batch_norm_forward(np64(p), eps=EPS).mean for p in parts])
    d_r = np.abs(m_r - exact_m_r)
    bound = (n_r / n * (2 * np.abs(exact_m_r - ref.mean) * d_r + d_r**2)).sum(0) + 1e-6 * ref_var
    assert np.all(np.abs(var - ref_var) <= bound), (var - ref_var, bound)
    assert np.max(np.abs(mean.to(F64).numpy() - ref.mean)) <= 2 * 2.0**-10


# ------------------------------------------------------------------ torch's own SyncBatchNorm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_group():
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["f64", "f32"])
def test_torch_sync_batch_norm_function_runs_on_cpu_under_gloo(gloo_group, dtype, fmt, affine):
    from torch.nn.modules._functions import SyncBatchNorm

    inp = make_inputs((4, 3, 5, 6), dtype, fmt, affine=affine, seed=7)
    leaves = [inp.x.clone().requires_grad_()] + ([inp.w.clone().requires_grad_(), inp.b.clone().requires_grad_()] if affine else [])
    rm, rv = inp.rm.clone(), inp.rv.clone()
    y = SyncBatchNorm.apply(leaves[0], *(leaves[1:] or [None, None]), rm, rv, EPS, MOMENTUM, gloo_group, 1)
    grads = torch.autograd.grad(y, leaves, inp.dy)

    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    rm_t, rv_t = inp.rm.clone(), inp.rv.clone()
    y_t = F.batch_norm(ref_leaves[0], rm_t, rv_t, *(ref_leaves[1:] or [None, None]), True, MOMENTUM, EPS)
    grads_t = torch.autograd.grad(y_t, ref_leaves, inp.dy)

    tol = RTOL[dtype]
    assert rel_err(y, np64(y_t)) <= tol
    for name, a, e in zip(["dx", "dweight", "dbias"], grads, grads_t):
        assert rel_err(a, np64(e)) <= tol, name
    assert rel_err(rm, np64(rm_t)) <= tol and rel_err(rv, np64(rv_t)) <= tol
    if fmt == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert grads[0].is_contiguous(memory_format=torch.channels_last)


def test_torch_sync_batch_norm_function_with_empty_input(gloo_group):
    """torch filters the empty rank out before gathering: the gather sees zero ranks. y is empty,
    the gradients are None (autograd's zeros) and the running stats keep their values."""
    from torch.nn.modules._functions import SyncBatchNorm

    x = torch.randn(0, 3, 4, 4, requires_grad=True)
    w, b = torch.ones(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    rm, rv = torch.full((3,), 0.5), torch.full((3,), 2.0)
    y = SyncBatchNorm.apply(x, w, b, rm, rv, EPS, MOMENTUM, gloo_group, 1)
    assert y.shape == x.shape
    assert torch.autograd.grad(y.sum(), (x, w, b), allow_unused=True) == (None, None, None)
    assert torch.equal(rm, torch.full((3,), 0.5)) and torch.equal(rv, torch.full((3,), 2.0))


# -------------------------------------------------------------------- CUDA semantics in corners


@pytest.mark.parametrize("dtype,pdtype", DTYPES, ids=DTYPE_IDS)
def test_output_dtypes_and_undefined_outputs(dtype, pdtype):
    inp = make_inputs((2, 3, 4), dtype, param_dtype=pdtype)
    acc = acc_dtype(dtype)
    mean, invstd = torch.batch_norm_stats(inp.x, EPS)
    assert (mean.dtype, invstd.dtype, mean.shape) == (acc, acc, (3,))
    for flags in [(True, True, True), (True, False, False), (False, True, False), (False, False, True), (False, False, False)]:
        out = torch.batch_norm_backward_reduce(inp.dy, inp.x, mean, invstd, inp.w, *flags)
        expect = [acc if flags[0] else None, acc if flags[0] else None,
                  pdtype if flags[1] else None, pdtype if flags[2] else None]
        assert [None if t is None else t.dtype for t in out] == expect, flags
    # no weight: grad_bias in the input's dtype
    _, _, gw, gb = torch.batch_norm_backward_reduce(inp.dy, inp.x, mean, invstd, None, False, False, True)
    assert gw is None and gb.dtype == dtype
    # gather: output in acc of the gathered stats' dtype; counts may be in the running stats' dtype
    mg, ig = torch.batch_norm_gather_stats_with_counts(
        inp.x, mean[None], invstd[None], inp.rm, inp.rv, MOMENTUM, EPS, torch.tensor([8.0], dtype=pdtype)
    )
    assert (mg.dtype, ig.dtype, inp.rm.dtype, inp.rv.dtype) == (acc, acc, pdtype, pdtype)
    half_stats = torch.batch_norm_gather_stats_with_counts(
        inp.x, mean[None].to(dtype), invstd[None].to(dtype), None, None, MOMENTUM, EPS, torch.tensor([8.0])
    )
    assert half_stats[0].dtype == acc  # f16/bf16 stats (an empty rank's zeros in torch) give float32


@pytest.mark.parametrize("shape,fmt", SHAPES, ids=SHAPE_IDS)
def test_outputs_keep_the_input_memory_format(shape, fmt):
    inp = make_inputs(shape, BF16, fmt, F32)
    want = {"channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d}.get(fmt, torch.contiguous_format)
    mean, invstd = torch.batch_norm_stats(inp.x, EPS)
    y = torch.batch_norm_elemt(inp.x, inp.w, inp.b, mean, invstd, EPS)
    sdy, sdx, _, _ = torch.batch_norm_backward_reduce(inp.dy, inp.x, mean, invstd, inp.w, True, False, False)
    count = torch.tensor([[inp.x.numel() // shape[1]]], dtype=torch.int32)
    dx = torch.batch_norm_backward_elemt(inp.dy, inp.x, mean, invstd, inp.w, sdy, sdx, count)
    for name, t in [("y", y), ("dx", dx)]:
        assert t.dtype == BF16 and t.shape == inp.x.shape, name
        assert t.is_contiguous(memory_format=want), f"{name} is not {want}"


def test_backward_elemt_count_is_the_sum_of_int32_per_rank_counts():
    """n = count.sum() over a (W, 1) int32 tensor (torch passes count_all.to(torch.int32)); like
    CUDA (which reads it as int*), any other dtype is refused -- a count in the input's dtype
    is a SyncBN bug (bf16 rounds counts above 256)."""
    inp = make_inputs((6, 3, 5), F64)
    mean, invstd = torch.batch_norm_stats(inp.x, EPS)
    sdy, sdx, _, _ = torch.batch_norm_backward_reduce(inp.dy, inp.x, mean, invstd, inp.w, True, False, False)
    split = torch.tensor([[10], [0], [20]], dtype=torch.int32)  # 30 = 6 * 5 in all
    dx = torch.batch_norm_backward_elemt(inp.dy, inp.x, mean, invstd, inp.w, sdy, sdx, split)
    ref = batch_norm_backward(np64(inp.dy), np64(inp.x), np64(inp.w), EPS)
    assert rel_err(dx, ref.dx) <= RTOL[F64]
    wrong = torch.batch_norm_backward_elemt(inp.dy, inp.x, mean, invstd, inp.w, sdy, sdx, split[:1])
    assert rel_err(wrong, ref.dx) > 0.01  # the count is used
    for dtype in (torch.int64, torch.float32, torch.bfloat16):
        with pytest.raises(RuntimeError, match=r"scalar type Int \(int32\)"):
            torch.batch_norm_backward_elemt(inp.dy, inp.x, mean, invstd, inp.w, sdy, sdx, split.to(dtype))


def test_empty_input():
    x = torch.randn(0, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    w, b = torch.rand(3, dtype=F32), torch.rand(3, dtype=F32)
    mean, invstd = torch.batch_norm_stats(x, EPS)
    assert torch.equal(mean, torch.zeros(3)) and torch.isnan(invstd).all()  # CUDA's 0/0
    m, s = torch.ones(3), torch.ones(3)
    y = torch.batch_norm_elemt(x, w, b, m, s, EPS)
    assert y.shape == x.shape and y.dtype == x.dtype
    sdy, sdx, gw, gb = torch.batch_norm_backward_reduce(x, x, m, s, w, True, True, True)
    for t in (sdy, sdx, gw, gb):
        assert torch.equal(t, torch.zeros(3))
    dx = torch.batch_norm_backward_elemt(x, x, m, s, w, sdy, sdx, torch.tensor([[5]], dtype=torch.int32))
    assert dx.shape == x.shape


def test_gather_ignores_count_zero_ranks_and_handles_zero_total():
    mean = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [3.0, 4.0]])
    invstd = torch.tensor([[1.0, 0.5], [float("nan"), 0.0], [2.0, 1.0]])
    counts = torch.tensor([4.0, 0.0, 4.0])
    x = torch.empty(0, 2)
    rm, rv = torch.zeros(2), torch.ones(2)
    mg, ig = torch.batch_norm_gather_stats_with_counts(x, mean, invstd, rm, rv, 0.5, 0.0, counts)
    # two ranks of 4: var = mean of the variances + variance of the means
    var = np.array([(1.0 + 0.25) / 2 + 1.0, (4.0 + 1.0) / 2 + 1.0])
    np.testing.assert_allclose(mg.numpy(), [2.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(ig.numpy(), 1 / np.sqrt(var), rtol=1e-6)
    np.testing.assert_allclose(rv.numpy(), 0.5 + 0.5 * var * 8 / 7, rtol=1e-6)

    rm, rv = torch.full((2,), 0.3), torch.full((2,), 0.7)
    mg, ig = torch.batch_norm_gather_stats_with_counts(x, mean[:0], invstd[:0], rm, rv, 0.5, EPS, counts[:0])
    assert torch.equal(mg, torch.zeros(2)) and torch.isnan(ig).all()
    assert torch.equal(rm, torch.full((2,), 0.3)) and torch.equal(rv, torch.full((2,), 0.7))


def test_gather_stats_with_one_count_for_all_ranks():
    """aten::batch_norm_gather_stats (the pre-1.6 signature, int count) is registered too."""
    mean = torch.tensor([[1.0], [3.0]], dtype=F64)
    invstd = torch.tensor([[1.0], [1.0]], dtype=F64)
    mg, ig = torch.batch_norm_gather_stats(torch.empty(0, 1, dtype=F64), mean, invstd, None, None, 0.1, 0.0, 10)
    assert mg.item() == 2.0 and abs(ig.item() - 1 / np.sqrt(2.0)) < 1e-15


def test_zero_variance_with_zero_eps_gives_zero_invstd():
    """CUDA's InvStd: var == 0 and eps == 0 -> invstd 0 (not inf), so y = bias, not NaN."""
    x = torch.full((4, 2, 3), 7.0)
    mean, invstd = torch.batch_norm_stats(x, 0.0)
    assert torch.equal(invstd, torch.zeros(2)) and torch.equal(mean, torch.full((2,), 7.0))
    mg, ig = torch.batch_norm_gather_stats_with_counts(x, mean[None], invstd[None], None, None, 0.1, 0.0, torch.tensor([12.0]))
    assert torch.equal(ig, torch.zeros(2))
    y = torch.batch_norm_elemt(x, None, torch.tensor([1.0, -1.0]), mg, ig, 0.0)
    assert torch.equal(y, torch.tensor([1.0, -1.0]).view(1, 2, 1).expand(4, 2, 3))


def test_out_overloads_work():
    """batch_norm_elemt.out is registered here; the other .out overloads are torch's composite
    wrappers around the functional kernels."""
    inp = make_inputs((3, 2, 4), F32)
    mean, invstd = torch.batch_norm_stats(inp.x, EPS)
    out = torch.empty_like(inp.x)
    torch.batch_norm_elemt(inp.x, inp.w, inp.b, mean, invstd, EPS, out=out)
    assert torch.equal(out, torch.batch_norm_elemt(inp.x, inp.w, inp.b, mean, invstd, EPS))
    m_out, s_out = torch.empty(0), torch.empty(0)
    torch.ops.aten.batch_norm_stats.out(inp.x, EPS, out0=m_out, out1=s_out)
    assert torch.equal(m_out, mean) and torch.equal(s_out, invstd)


def test_bad_input_raises():
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.batch_norm_stats(torch.randn(5), EPS)
    with pytest.raises(RuntimeError, match="float16, bfloat16, float32 or float64"):
        torch.batch_norm_stats(torch.ones(2, 3, dtype=torch.int64), EPS)
    with pytest.raises(RuntimeError, match="world_size = 2"):
        torch.batch_norm_gather_stats_with_counts(
            torch.empty(0, 3), torch.zeros(2, 3), torch.ones(2, 3), None, None, 0.1, EPS, torch.ones(3)
        )


# --------------------------------------------------------------------------------- registration


def test_registration_is_idempotent():
    before = dict(cpu_primitives.REGISTERED)
    assert set(before) == set(cpu_primitives.OPS)
    assert cpu_primitives.register() == before
    importlib.reload(cpu_primitives)
    assert cpu_primitives.REGISTERED == before
    for name in cpu_primitives.OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"), name
    x = torch.randn(3, 2)
    assert torch.batch_norm_stats(x, EPS)[0].shape == (2,)


def test_registration_leaves_an_existing_kernel_alone_and_never_overrides():
    """In a fresh process: a CPU kernel that exists before the import is kept (and reported),
    the others are registered, and importing + reloading again registers nothing twice (torch
    warns when a kernel is overridden -- the warnings are errors here)."""
    script = textwrap.dedent(
        """
        import importlib, warnings
        warnings.simplefilter("error")
        import torch
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("batch_norm_stats", lambda x, eps: (torch.full((x.shape[1],), 42.0), torch.ones(x.shape[1])), "CPU")
        import normcheck.kernels.syncbn
        from normcheck.kernels.syncbn import cpu_primitives as p
        import normcheck.kernels.syncbn.cpu_primitives
        importlib.reload(p)
        p.register()
        assert p.REGISTERED.pop("batch_norm_stats") == "pre-existing", p.REGISTERED
        assert set(p.REGISTERED.values()) == {"normcheck"}, p.REGISTERED
        assert torch.batch_norm_stats(torch.randn(2, 3), 1e-5)[0][0].item() == 42.0
        assert torch.batch_norm_elemt(torch.zeros(2, 3), None, None, torch.zeros(3), torch.ones(3), 0.0).shape == (2, 3)
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
