"""Adaptive GroupNorm mutants and correct implementations, under the adagn contract
fn(input, scale, shift, num_groups, weight, bias, eps), scale and shift (N, C) broadcast over the spatial dims.

The bug classes of a conditioned GroupNorm (diffusion U-Nets' scale-shift norm): modulating by scale instead of
1 + scale, the modulation's gradients summed over the batch too (one value for every sample), dscale taken of x
instead of the normalised output, dx without the modulation, the per-(sample, channel) vectors indexed by group instead
of channel, dshift never reaching the shift.

Two correct styles: `composed` (the textbook GroupNorm of tests/mutants/textbook.py, then the modulation through
autograd) and `fused` (one autograd.Function as a fused kernel is written: the group statistics and the modulation
in float32, an explicit backward).
"""
from __future__ import annotations

import torch

from normcheck.frameworks.torch import accumulation_dtype

from .textbook import group_norm

_textbook = group_norm()


def _over_spatial(a: torch.Tensor, x: torch.Tensor, bug=None, groups: int = 1) -> torch.Tensor:
    """(N, C) against x (N, C, *spatial); the indexing bug reads one value per group (its first channel's) for every
    channel of the group, as a kernel indexing the vector by the group it is normalising does."""
    if bug == "per_group_vectors":
        n, c = a.shape
        a = a.reshape(n, groups, -1)[:, :, :1].expand(n, groups, c // groups).reshape(n, c)
    return a.reshape(*a.shape, *(1,) * (x.dim() - 2))


def composed(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    # (contiguous: torch's own reductions over a channels_last_3d group lose the variance of an offset group, the
    # known issue torch-gn-channels-last-variance, which the textbook, written in torch ops, would inherit)
    y = _textbook(input.contiguous(), num_groups, weight, bias, eps)
    return y * (1 + _over_spatial(scale, input)) + _over_spatial(shift, input)


class _FusedAdaGN(torch.autograd.Function):
    """ŷ = GN(x) and y = ŷ·(1 + scale) + shift in the accumulation dtype; backward: GroupNorm's closed form of
    dy·(1 + scale), and the spatial sums of dy·ŷ and dy. `bug` changes one step."""

    @staticmethod
    def forward(ctx, x, scale, shift, weight, bias, groups, eps, bug):
        acc = accumulation_dtype(x.dtype)
        n, c = x.shape[:2]
        xs = x.to(acc).reshape(n, groups, -1)
        mean = xs.mean(dim=2, keepdim=True)
        rstd = torch.rsqrt(((xs - mean) ** 2).mean(dim=2, keepdim=True) + eps)
        xhat = ((xs - mean) * rstd).reshape(x.shape)
        per_channel = (1, c) + (1,) * (x.dim() - 2)
        y_norm = xhat * weight.to(acc).reshape(per_channel) if weight is not None else xhat
        if bias is not None:
            y_norm = y_norm + bias.to(acc).reshape(per_channel)
        m = _over_spatial(scale.to(acc), x, bug, groups)
        y = y_norm * (m if bug == "scale_without_one" else 1 + m) + _over_spatial(shift.to(acc), x, bug, groups)
        ctx.save_for_backward(x, scale, weight, xhat, rstd, y_norm)
        ctx.groups, ctx.bug = groups, bug
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, scale, weight, xhat, rstd, y_norm = ctx.saved_tensors
        acc, bug, groups = accumulation_dtype(x.dtype), ctx.bug, ctx.groups
        n, c = x.shape[:2]
        dya = dy.to(acc)
        m = 1 + _over_spatial(scale.to(acc), x, bug, groups)
        dnorm = dya if bug == "dx_unmodulated" else dya * m
        per_channel = (1, c) + (1,) * (x.dim() - 2)
        g = (dnorm * weight.to(acc).reshape(per_channel) if weight is not None else dnorm).reshape(n, groups, -1)
        xh = xhat.reshape(n, groups, -1)
        dx = rstd * (g - g.mean(dim=2, keepdim=True) - xh * (g * xh).mean(dim=2, keepdim=True))
        spatial = tuple(range(2, x.dim()))
        of = x.to(acc) if bug == "dscale_of_x" else y_norm
        dscale, dshift = (a.sum(dim=spatial) if spatial else a for a in (dya * of, dya))
        if bug == "modulation_grads_over_batch":
            dscale, dshift = (a.sum(dim=0, keepdim=True).expand_as(a) for a in (dscale, dshift))
        if bug == "dshift_dropped":
            dshift = torch.zeros_like(dshift)
        channel_sum = (0,) + spatial
        dweight = None if weight is None else (dnorm * xhat).sum(dim=channel_sum).to(weight.dtype)
        dbias = None if ctx.bias_dtype is None else dnorm.sum(dim=channel_sum).to(ctx.bias_dtype)
        return (dx.reshape(x.shape).to(x.dtype), dscale.to(scale.dtype), dshift.to(scale.dtype), dweight, dbias,
                None, None, None)


def fused(bug: str | None = None):
    def adagn(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
        return _FusedAdaGN.apply(input, scale, shift, weight, bias, num_groups, eps, bug)
    adagn.__qualname__ = bug or "fused"
    return adagn


BUGS = ("scale_without_one", "modulation_grads_over_batch", "dscale_of_x", "dx_unmodulated", "per_group_vectors",
        "dshift_dropped")
MUTANTS = {bug: fused(bug) for bug in BUGS}
CORRECT = {"composed": composed, "fused": fused()}
globals().update(MUTANTS | CORRECT)
