"""RMSNorm mutants: a textbook RMSNorm (explicit forward and backward, float32 accumulation for half
inputs) with one bug each, from the bug classes of real RMSNorm kernels: the mean of squares summed
or squared in half precision (x² overflows f16 at |x| > 256), rstd rounded to bf16, eps outside the
sqrt or the wrong dtype's eps, the weight offset forgotten (in the forward or only in the backward),
a casting chain whose dweight does not follow its forward, weight-gradient partial sums in bf16,
a dropped term, LayerNorm's centring, a multi-dim normalized_shape reduced over its last dim only,
strides and the storage offset ignored; and the fp8 output's (tests/mutants/_fp8.py).

Functions have F.rms_norm's signature (`--impl tests.mutants.rmsnorm:drop_xhat_term`); the mutants of
a convention (a weight offset, a casting chain) are Impl records that say which one they follow
(`--impl tests.mutants.rmsnorm:forgets_offset` runs them under it).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from math import prod

import torch

from normcheck import Impl
from normcheck.frameworks.torch import accumulation_dtype

from . import _fp8
from ._records import test_code
from .textbook import _read, _sum


@dataclass(frozen=True)
class Bugs:
    offset: float = 0.0                    # the convention followed: scale by w + offset
    before_weight: bool = False            # the convention followed: x̂ rounded to the input dtype before · w
    low_precision_squares: bool = False    # x² and their sum in the f16/bf16 input dtype
    bf16_rstd: bool = False                # rstd rounded to bf16 (then used in forward and backward)
    eps_outside_sqrt: bool = False         # rstd = 1 / (sqrt(ms) + eps)
    eps_of_input_dtype: bool = False       # eps=None means finfo(input dtype).eps (torch computes in f32: f32's)
    forgets_offset: bool = False           # follows w + offset but scales by w
    offset_only_forward: bool = False      # the backward's g = w·dy without the offset
    dweight_unrounded_xhat: bool = False   # before-weight forward, dweight from the unrounded x̂
    bf16_dweight_partials: bool = False    # dweight summed in blocks of rows whose partial sums are bf16
    drop_xhat_term: bool = False           # dx = rstd·g, without −x̂·mean(g·x̂)
    centres: bool = False                  # subtracts the mean (LayerNorm without β)
    last_dim_only: bool = False            # a multi-dim normalized_shape reduced over its last dim only
    ignore_strides: bool = False           # reads x and dy as if contiguous
    ignore_storage_offset: bool = False    # reads x and dy from the start of their storage
    constant_stats_double_backward: bool = False  # backward from the forward's x̂ and rstd: constants to a 2nd derivative
    overwrites_dy: bool = False            # backward writes dx into grad_output's buffer
    frozen_x_fast_path: bool = False       # with x frozen, a fast path computes dweight = Σ dy·x
    one_row_blocks: bool = False           # one row: the mean of squares of blocks of 1024 averaged unweighted
    eps_or_default: bool = False           # eps = eps or 1e-6: eps = 0 (and None) become 1e-6


ROW_BLOCK = 64  # rows per partial sum of the bf16-partials mutant
BLOCK = 1024  # elements per block of the one-row mutant


def _normalise(x, weight, dims: int, eps, bugs: Bugs):
    """(x̂, x̂ as the weight sees it, rstd, the scale w + offset) in the accumulation dtype, from torch ops:
    differentiable when the backward recomputes them."""
    low, acc = x.dtype, accumulation_dtype(x.dtype)
    rows, hidden = prod(x.shape[: x.dim() - dims]), prod(x.shape[x.dim() - dims:])
    reduce = x.shape[-1] if bugs.last_dim_only else hidden
    xs = _read(x, bugs).reshape(-1, reduce).to(acc)
    if eps is None:
        eps = torch.finfo(low if bugs.eps_of_input_dtype else acc).eps
    if bugs.centres:
        xs = xs - xs.mean(dim=1, keepdim=True)
    if bugs.low_precision_squares:  # squared in the input dtype, summed like a 16-lane kernel in it
        ms = _sum((xs.to(low) * xs.to(low)).to(acc), (1,), None, low, in_low=True) / reduce
    elif bugs.one_row_blocks and xs.shape[0] == 1 and reduce > BLOCK:  # a decode path splitting the row
        ms = torch.stack([(b * b).mean(dim=1) for b in xs.split(BLOCK, dim=1)], dim=1).mean(dim=1, keepdim=True)
    else:
        ms = (xs * xs).mean(dim=1, keepdim=True)
    rstd = 1 / (ms.sqrt() + eps) if bugs.eps_outside_sqrt else (ms + eps).rsqrt()
    if bugs.bf16_rstd:
        rstd = rstd.to(torch.bfloat16).to(acc)
    xhat = (xs * rstd).reshape(rows, hidden)
    seen = xhat.to(low).to(acc) if bugs.before_weight else xhat
    scale = None if weight is None else weight.reshape(-1).to(acc) + (0.0 if bugs.forgets_offset else bugs.offset)
    rstd = rstd.reshape(rows, -1)
    if rstd.shape[1] > 1:  # one per chunk of the last dim: per element
        rstd = rstd.repeat_interleave(reduce, dim=1)
    return xhat, seen, rstd, scale


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, dims: int, eps, bugs: Bugs):
        xhat, seen, rstd, scale = _normalise(x, weight, dims, eps, bugs)
        y = seen if scale is None else seen * scale
        # The backward recomputes x̂ from x (a double backward then differentiates it); the constant-statistics
        # mutant uses the forward's, which a second derivative sees as constants.
        ctx.save_for_backward(x, weight, xhat, seen, rstd)
        ctx.bugs, ctx.low, ctx.shape, ctx.dims, ctx.eps = bugs, x.dtype, x.shape, dims, eps
        ctx.wshape, ctx.wdtype = (None, None) if weight is None else (weight.shape, weight.dtype)
        return y.reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, xhat, seen, rstd = ctx.saved_tensors
        bugs = ctx.bugs
        scale = None
        if bugs.constant_stats_double_backward:
            if weight is not None:
                scale = weight.reshape(-1).to(xhat.dtype) + (0.0 if bugs.forgets_offset else bugs.offset)
        else:
            xhat, seen, rstd, scale = _normalise(x, weight, ctx.dims, ctx.eps, bugs)
        dys = _read(dy, bugs).reshape(xhat.shape).to(xhat.dtype)
        if scale is not None and bugs.offset_only_forward:
            scale = scale - bugs.offset
        g = dys if scale is None else dys * scale
        h = torch.zeros_like(g[:, :1]) if bugs.drop_xhat_term else (g * xhat).mean(dim=1, keepdim=True)
        dx = (rstd * (g - xhat * h)).reshape(ctx.shape).to(ctx.low)
        if bugs.overwrites_dy:  # dx written into grad_output's buffer
            dx = dy.copy_(dx)
        dweight = None
        if scale is not None:
            products = dys * (xhat if bugs.dweight_unrounded_xhat else seen)
            if bugs.frozen_x_fast_path and not ctx.needs_input_grad[0]:
                products = products / rstd  # a fast path for a frozen input: Σ dy·x, the rstd forgotten
            if bugs.bf16_dweight_partials:
                blocks = products.split(ROW_BLOCK)
                dweight = torch.stack([b.sum(dim=0).to(torch.bfloat16) for b in blocks]).to(xhat.dtype).sum(dim=0)
            else:
                dweight = products.sum(dim=0)
            dweight = dweight.reshape(ctx.wshape).to(ctx.wdtype)
        return dx, dweight, None, None, None


def rms_norm(bugs: Bugs = Bugs()):
    """F.rms_norm's signature, with `bugs` switched on."""
    def rms_norm(input, normalized_shape, weight=None, eps=None):
        eps = (eps or 1e-6) if bugs.eps_or_default else eps
        return _RMSNorm.apply(input, weight, len(normalized_shape), eps, bugs)
    return rms_norm


def _convention(bugs: Bugs) -> dict:
    return {"weight_offset": bugs.offset, "casting": "before-weight" if bugs.before_weight else "end"}


def _impl(name: str, bugs: Bugs, what: str) -> Impl:
    return test_code("rmsnorm", name, rms_norm(bugs), what, _convention(bugs))


GEMMA, LLAMA = Bugs(offset=1.0), Bugs(before_weight=True)
# Bugs of the convention-free formula, in torch's convention; and those of a convention, under it.
PLAIN = ("low_precision_squares", "bf16_rstd", "eps_outside_sqrt", "eps_of_input_dtype", "bf16_dweight_partials",
         "drop_xhat_term", "centres", "last_dim_only", "ignore_strides", "ignore_storage_offset",
         "constant_stats_double_backward", "overwrites_dy", "frozen_x_fast_path", "one_row_blocks", "eps_or_default")
CONVENTION_BUGS = {"forgets_offset": GEMMA, "offset_only_forward": GEMMA, "dweight_unrounded_xhat": LLAMA}
assert set(PLAIN) | set(CONVENTION_BUGS) == {f.name for f in fields(Bugs)} - {"offset", "before_weight"}

MUTANTS = {bug: _impl(bug, Bugs(**{bug: True}), f"mutant: {bug}") for bug in PLAIN}
MUTANTS |= {bug: _impl(bug, Bugs(**{**vars(base), bug: True}), f"mutant: {bug}") for bug, base in CONVENTION_BUGS.items()}
textbook = rms_norm()
CORRECT = {
    "textbook": _impl("textbook", Bugs(), "textbook RMSNorm, torch's convention"),
    "gemma": _impl("gemma", GEMMA, "textbook RMSNorm scaling by w + 1 (Gemma)"),
    "llama": _impl("llama", LLAMA, "textbook RMSNorm rounding x̂ before · w (Llama)"),
}
FP8_MUTANTS, FP8_CORRECT = _fp8.records(textbook, "rmsnorm", _convention(Bugs()), __name__)
MUTANTS |= FP8_MUTANTS
CORRECT |= FP8_CORRECT
gemma, llama = CORRECT["gemma"], CORRECT["llama"]  # --impl tests.mutants.rmsnorm:gemma
globals().update(MUTANTS | FP8_CORRECT)
