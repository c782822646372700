"""Adaptive LayerNorm (adaLN) mutants and correct implementations, under the adaln contract
fn(input, scale, shift, normalized_shape, weight, bias, eps), scale and shift (N, *normalized_shape).

The bug classes of modulated-norm kernels: modulating by scale instead of 1 + scale, the modulation's gradients
summed over the batch as well as the sequence (one value for every sample), dscale taken of x instead of the
normalised x, dx without the modulation factor, the per-sample vectors tiled over the flattened rows in the wrong
order (repeat instead of repeat_interleave), dshift never reaching the shift, dscale's sequence sum accumulated in
the input's half precision (a long sequence loses it).

Two correct styles: `composed` (the textbook LayerNorm of tests/mutants/textbook.py, then the modulation through
autograd) and `fused` (one autograd.Function as a fused kernel is written: the row statistics and the modulation in
float32, an explicit backward).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.ops.adaln import over_sequence

from .textbook import layer_norm

_textbook = layer_norm()


def composed(input, scale, shift, normalized_shape, weight=None, bias=None, eps=1e-5):
    y = _textbook(input, normalized_shape, weight, bias, eps)
    return y * (1 + over_sequence(scale, input.dim())) + over_sequence(shift, input.dim())


class _FusedAdaLN(torch.autograd.Function):
    """ŷ and y = ŷ·(1 + scale) + shift in the accumulation dtype; backward: the LayerNorm closed form of dy·(1 +
    scale) and the sequence sums of dy·ŷ and dy. `bug` changes one step."""

    @staticmethod
    def forward(ctx, x, scale, shift, weight, bias, dims, eps, bug):
        acc = accumulation_dtype(x.dtype)
        xa = x.to(acc)
        axes = tuple(range(x.dim() - dims, x.dim()))
        mean = xa.mean(dim=axes, keepdim=True)
        rstd = torch.rsqrt(((xa - mean) ** 2).mean(dim=axes, keepdim=True) + eps)
        xhat = (xa - mean) * rstd
        y_norm = xhat * weight.to(acc) if weight is not None else xhat
        if bias is not None:
            y_norm = y_norm + bias.to(acc)
        m = _modulation(scale.to(acc), x, bug)
        y = y_norm * (m if bug == "scale_without_one" else 1 + m) + _modulation(shift.to(acc), x, bug)
        ctx.save_for_backward(x, scale, weight, xhat, rstd, y_norm)
        ctx.dims, ctx.bug, ctx.has_bias, ctx.bias_dtype = dims, bug, bias is not None, None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, scale, weight, xhat, rstd, y_norm = ctx.saved_tensors
        acc, bug, dims = accumulation_dtype(x.dtype), ctx.bug, ctx.dims
        dya = dy.to(acc)
        m = 1 + _modulation(scale.to(acc), x, bug)
        dnorm = dya if bug == "dx_unmodulated" else dya * m
        rows = prod(x.shape[: x.dim() - dims])
        g = (dnorm * weight.to(acc) if weight is not None else dnorm).reshape(rows, -1)
        xh = xhat.reshape(rows, -1)
        dx = rstd.reshape(rows, 1) * (g - g.mean(dim=1, keepdim=True) - xh * (g * xh).mean(dim=1, keepdim=True))
        seq = tuple(range(1, x.dim() - scale.dim() + 1))
        of = x.to(acc) if bug == "dscale_of_x" else y_norm
        dscale, dshift = (a.sum(dim=seq) if seq else a for a in (dya * of, dya))
        if bug == "sums_sequence_in_half" and seq:
            dscale = _running_sum((dya * of).to(x.dtype), seq)
        if bug == "modulation_grads_over_batch":
            dscale, dshift = (a.sum(dim=0, keepdim=True).expand_as(a) for a in (dscale, dshift))
        if bug == "dshift_dropped":
            dshift = torch.zeros_like(dshift)
        shape = x.shape[x.dim() - dims:]
        dweight = None if weight is None else (dnorm * xhat).reshape(rows, -1).sum(0).reshape(shape).to(weight.dtype)
        dbias = None if not ctx.has_bias else dnorm.reshape(rows, -1).sum(0).reshape(shape).to(ctx.bias_dtype)
        return (dx.reshape(x.shape).to(x.dtype), dscale.to(scale.dtype), dshift.to(scale.dtype), dweight, dbias,
                None, None, None)


def _running_sum(terms: torch.Tensor, seq: tuple[int, ...]) -> torch.Tensor:
    """Σ over the sequence dims one token at a time, each partial sum rounded to the terms' dtype (a kernel whose
    accumulator is the input's half precision)."""
    rows = terms.movedim(0, -1).reshape(prod(terms.shape[d] for d in seq), *terms.shape[len(seq) + 1:], terms.shape[0])
    total = torch.zeros_like(rows[0])
    for row in rows:
        total = (total + row).to(terms.dtype)
    return total.movedim(-1, 0)


def _modulation(a: torch.Tensor, x: torch.Tensor, bug) -> torch.Tensor:
    """A per-sample vector against x; the tiling bug lays it over x's flattened rows sample-major where they are
    sequence-major (repeat where repeat_interleave was meant)."""
    if bug != "tiled_rows" or x.dim() - a.dim() < 1:
        return over_sequence(a, x.dim())
    sequence = prod(x.shape[1: x.dim() - a.dim() + 1])
    flat = a.reshape(a.shape[0], -1).repeat(sequence, 1)  # row r gets sample r % N, not r // sequence
    return flat.reshape(x.shape)


def fused(bug: str | None = None):
    def adaln(input, scale, shift, normalized_shape, weight=None, bias=None, eps=1e-5):
        return _FusedAdaLN.apply(input, scale, shift, weight, bias, len(normalized_shape), eps, bug)
    adaln.__qualname__ = bug or "fused"
    return adaln


BUGS = ("scale_without_one", "modulation_grads_over_batch", "dscale_of_x", "dx_unmodulated", "tiled_rows",
        "dshift_dropped", "sums_sequence_in_half")
MUTANTS = {bug: fused(bug) for bug in BUGS}
CORRECT = {"composed": composed, "fused": fused()}
globals().update(MUTANTS | CORRECT)
