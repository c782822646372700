"""The project's own Triton LayerNorm and RMSNorm, forward and backward, written the way real Triton norm kernels
are: a program normalises a block of rows (a row is the normalised dims, held in one block of columns); the backward
computes dx row by row and writes each program's partial sums of dγ and dβ into a buffer that a second kernel
reduces. Wrapped in an autograd.Function under the ops' --impl contract (F.layer_norm's and F.rms_norm's).

One correct version of each, and variants with real Triton-kernel bugs, switched by the kernels' constexprs:
  *_tail_other_one         the statistics load pads the row's tail with other=1.0 instead of 0.0: the padded lanes
                           count in the mean (the mean of squares) whenever the row length is not a power of two
  *_unmasked_variance      the variance sums (x - mean)² over the padded lanes too, which hold mean²
  *_partials_reduced_once  the dγ/dβ reduction reads one block of PARTIALS_PER_STEP partial rows and never loops:
                           right until more programs than that wrote partials

Statistics and gradients are computed in float32 (float64 for f64 input) and rounded once to their dtype. On a CPU
they run under Triton's interpreter (`normcheck compare ... --triton-interpret`), which normcheck switches on in the
worker process before it imports this module: @triton.jit decides there whether a kernel is interpreted.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

MAX_ROW = 65536             # the longest row one block of columns holds
ROWS_TILE = 4096            # elements a program holds: it takes ROWS_TILE // block-columns rows at once
PARTIALS_PER_STEP = 4       # partial rows the reduction adds per step
REDUCE_COLUMNS = 1024       # columns per program of the reduction


@dataclass(frozen=True)
class Bugs:
    tail: float = 0.0           # what the statistics load reads in padded lanes (0: the sum is the row's)
    mask_variance: bool = True  # the variance leaves padded lanes out
    every_partial: bool = True  # the reduction loops over every block of partial rows


CORRECT = Bugs()


@triton.jit
def _forward(X, W, B, Y, Mean, Rstd, rows, cols, eps, CENTRED: tl.constexpr, HAS_W: tl.constexpr,
             HAS_B: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             TAIL: tl.constexpr, MASK_VARIANCE: tl.constexpr):
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    row_in = r < rows
    inside = row_in[:, None] & (c[None, :] < cols)
    at = r[:, None].to(tl.int64) * cols + c[None, :]
    x = tl.load(X + at, mask=inside, other=TAIL).to(COMPUTE)
    if CENTRED:
        mean = tl.sum(x, axis=1) / cols
        d = x - mean[:, None]
        if MASK_VARIANCE:
            d = tl.where(inside, d, 0.0)
        var = tl.sum(d * d, axis=1) / cols
    else:  # RMSNorm: the mean of squares about 0
        mean = tl.zeros([BLOCK_M], dtype=COMPUTE)
        var = tl.sum(x * x, axis=1) / cols
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(Mean + r, mean, mask=row_in)
    tl.store(Rstd + r, rstd, mask=row_in)
    y = (x - mean[:, None]) * rstd[:, None]
    if HAS_W:
        y = y * tl.load(W + c, mask=c < cols, other=0.0).to(COMPUTE)[None, :]
    if HAS_B:
        y = y + tl.load(B + c, mask=c < cols, other=0.0).to(COMPUTE)[None, :]
    tl.store(Y + at, y.to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _backward(X, W, DY, DX, Mean, Rstd, DW_PARTIAL, DB_PARTIAL, rows, cols, CENTRED: tl.constexpr,
              HAS_W: tl.constexpr, HAS_B: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    program = tl.program_id(0)
    r = program * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    row_in = r < rows
    inside = row_in[:, None] & (c[None, :] < cols)
    at = r[:, None].to(tl.int64) * cols + c[None, :]
    x = tl.load(X + at, mask=inside, other=0.0).to(COMPUTE)
    dy = tl.load(DY + at, mask=inside, other=0.0).to(COMPUTE)
    mean = tl.load(Mean + r, mask=row_in, other=0.0)
    rstd = tl.load(Rstd + r, mask=row_in, other=0.0)
    xhat = tl.where(inside, (x - mean[:, None]) * rstd[:, None], 0.0)
    if HAS_W:
        wdy = dy * tl.load(W + c, mask=c < cols, other=0.0).to(COMPUTE)[None, :]
    else:
        wdy = dy
    # dx = rstd · (γ·dy - x̂·mean(x̂·γ·dy) - mean(γ·dy)), the last term for LayerNorm only
    c1 = tl.sum(xhat * wdy, axis=1) / cols
    if CENTRED:
        c2 = tl.sum(wdy, axis=1) / cols
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
    else:
        dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
    tl.store(DX + at, dx.to(DX.dtype.element_ty), mask=inside)
    # This program's rows' share of dγ = Σ dy·x̂ and dβ = Σ dy, one partial row each
    partial = program.to(tl.int64) * cols + c
    if HAS_W:
        tl.store(DW_PARTIAL + partial, tl.sum(dy * xhat, axis=0), mask=c < cols)
    if HAS_B:
        tl.store(DB_PARTIAL + partial, tl.sum(dy, axis=0), mask=c < cols)


@triton.jit
def _sum_partials(PARTIAL, OUT, partials, cols, COMPUTE: tl.constexpr, BLOCK_P: tl.constexpr,
                  BLOCK_N: tl.constexpr, EVERY_PARTIAL: tl.constexpr):
    c = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=COMPUTE)
    if EVERY_PARTIAL:
        last = partials
    else:
        last = BLOCK_P
    for start in range(0, last, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        at = p[:, None].to(tl.int64) * cols + c[None, :]
        acc += tl.load(PARTIAL + at, mask=(p[:, None] < partials) & (c[None, :] < cols), other=0.0)
    tl.store(OUT + c, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=c < cols)


def _compute(dtype: torch.dtype) -> tuple[torch.dtype, tl.dtype]:
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


def _blocks(rows: int, cols: int) -> tuple[int, int]:
    """(rows, columns) a program holds: the whole row, and as many rows as fit in ROWS_TILE elements."""
    if cols > MAX_ROW:
        raise ValueError(f"rows of {cols} elements: these kernels hold a row in one block of at most {MAX_ROW}")
    block_n = triton.next_power_of_2(cols)
    return max(1, min(triton.next_power_of_2(rows), ROWS_TILE // block_n)), block_n


def _reduce(partial: torch.Tensor, like: torch.Tensor, bugs: Bugs) -> torch.Tensor:
    """The sum of the partial rows, in `like`'s dtype and shape (a parameter's gradient)."""
    parts, cols = partial.shape
    out = torch.empty(cols, dtype=like.dtype, device=like.device)
    _sum_partials[(triton.cdiv(cols, REDUCE_COLUMNS),)](
        partial, out, parts, cols, COMPUTE=_compute(partial.dtype)[1], BLOCK_P=PARTIALS_PER_STEP,
        BLOCK_N=min(REDUCE_COLUMNS, triton.next_power_of_2(cols)), EVERY_PARTIAL=bugs.every_partial)
    return out.view(like.shape)


class _Norm(torch.autograd.Function):
    """LayerNorm (centred) or RMSNorm over the trailing dims of `shape`, by the kernels above."""

    @staticmethod
    def forward(ctx, x, weight, bias, shape, eps, centred, bugs):
        cols = math.prod(shape)
        x2 = x.reshape(-1, cols).contiguous()
        rows = x2.shape[0]
        stat, compute = _compute(x.dtype)
        w = weight.reshape(-1).contiguous() if weight is not None else None
        b = bias.reshape(-1).contiguous() if bias is not None else None
        y = torch.empty_like(x2)
        mean = torch.empty(rows, dtype=stat, device=x.device)
        rstd = torch.empty(rows, dtype=stat, device=x.device)
        block_m, block_n = _blocks(rows, cols)
        _forward[(triton.cdiv(rows, block_m),)](
            x2, x2 if w is None else w, x2 if b is None else b, y, mean, rstd, rows, cols, float(eps),
            CENTRED=centred, HAS_W=w is not None, HAS_B=b is not None, COMPUTE=compute, BLOCK_M=block_m,
            BLOCK_N=block_n, TAIL=bugs.tail, MASK_VARIANCE=bugs.mask_variance)
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.shapes = (x.shape, None if weight is None else weight, None if bias is None else bias)
        ctx.centred, ctx.bugs = centred, bugs
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, w, mean, rstd = ctx.saved_tensors
        x_shape, weight, bias = ctx.shapes
        rows, cols = x2.shape
        stat, compute = _compute(x2.dtype)
        dy2 = dy.reshape(rows, cols).contiguous()
        dx = torch.empty_like(x2)
        block_m, block_n = _blocks(rows, cols)
        programs = triton.cdiv(rows, block_m)
        dw_partial = torch.empty(programs, cols, dtype=stat, device=x2.device) if weight is not None else None
        db_partial = torch.empty(programs, cols, dtype=stat, device=x2.device) if bias is not None else None
        _backward[(programs,)](
            x2, x2 if w is None else w, dy2, dx, mean, rstd, x2 if dw_partial is None else dw_partial,
            x2 if db_partial is None else db_partial, rows, cols, CENTRED=ctx.centred, HAS_W=weight is not None,
            HAS_B=bias is not None, COMPUTE=compute, BLOCK_M=block_m, BLOCK_N=block_n)
        dweight = _reduce(dw_partial, weight, ctx.bugs) if weight is not None else None
        dbias = _reduce(db_partial, bias, ctx.bugs) if bias is not None else None
        return dx.view(x_shape), dweight, dbias, None, None, None, None


def _layer_norm(input, normalized_shape, weight, bias, eps, bugs: Bugs):
    return _Norm.apply(input, weight, bias, tuple(normalized_shape), eps, True, bugs)


def _rms_norm(input, normalized_shape, weight, eps, bugs: Bugs):
    if eps is None:  # F.rms_norm's default: the machine epsilon of the precision it computes in
        eps = torch.finfo(_compute(input.dtype)[0]).eps
    return _Norm.apply(input, weight, None, tuple(normalized_shape), eps, False, bugs)


def triton_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(input, normalized_shape, weight, bias, eps, CORRECT)


def triton_rms_norm(input, normalized_shape, weight=None, eps=None):
    return _rms_norm(input, normalized_shape, weight, eps, CORRECT)


def layer_norm_tail_other_one(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(input, normalized_shape, weight, bias, eps, Bugs(tail=1.0))


def layer_norm_unmasked_variance(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(input, normalized_shape, weight, bias, eps, Bugs(mask_variance=False))


def layer_norm_partials_reduced_once(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(input, normalized_shape, weight, bias, eps, Bugs(every_partial=False))


def rms_norm_tail_other_one(input, normalized_shape, weight=None, eps=None):
    return _rms_norm(input, normalized_shape, weight, eps, Bugs(tail=1.0))


def rms_norm_partials_reduced_once(input, normalized_shape, weight=None, eps=None):
    return _rms_norm(input, normalized_shape, weight, eps, Bugs(every_partial=False))



def waits_for_other_programs(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """A layer that runs past any limit, as a persistent kernel whose programs wait for one another does in the
    interpreter (which runs them one after another): it sleeps, then is F.layer_norm."""
    time.sleep(60)
    return torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)
