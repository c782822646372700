"""Grouped RMSNorm mutants and correct implementations, under the contract fn(input, normalized_shape, weight, eps,
group_size=None): statistics per group of G consecutive values of the (flattened) normalised row, one weight over
the row (Mamba2's RMSNormGated group_size).

The bug classes of grouped-norm kernels (one program per group, the group index computed from the row's): the
statistics of the whole row, groups taken strided across the row instead of consecutive, the group size read as the
group count (Mamba2's ngroups and group_size confused), the weight indexed by the position in the group, and the
backward's mean(g·x̂) taken over the row instead of the group.

Two correct styles: `composed` (the textbook RMSNorm of tests/mutants/rmsnorm.py on each group, through autograd)
and `fused` (one autograd.Function as a fused kernel is written: float32 inside, an explicit backward).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.ops import rmsnorm

from ._records import test_code
from .rmsnorm import textbook

BUGS = ("row_statistics", "strided_groups", "size_as_count", "weight_by_position", "dx_row_mean")


def default_eps(dtype):
    return rmsnorm.default_eps({torch.float64: "f64"}.get(dtype, "f32"))


def grouped(a, rows: int, hidden: int, group_size: int | None, bug: str | None = None):
    """(rows, H) -> (rows, G, group) as a kernel indexes its groups; `bug` the way it goes wrong."""
    size = hidden if group_size is None or bug == "row_statistics" else group_size
    if bug == "size_as_count" and group_size is not None:
        size = hidden // group_size
    if bug == "strided_groups":
        return a.reshape(rows, size, hidden // size).transpose(1, 2)
    return a.reshape(rows, hidden // size, size)


def ungrouped(a, shape, bug: str | None = None):
    return (a.transpose(1, 2) if bug == "strided_groups" else a).reshape(shape)


def scale_of(weight, like, group_size, bug):
    """The weight over the grouped view `like` (the position in the group indexes it, for that bug)."""
    if weight is None:
        return None
    w = weight.to(like.dtype).reshape(-1)
    if bug == "weight_by_position" and group_size is not None:
        return w[: like.shape[2]].reshape(1, 1, -1)
    return grouped(w.reshape(1, -1), 1, w.numel(), group_size, bug)


class GroupedRMSNorm(torch.autograd.Function):
    """The grouped norm of u (the accumulation dtype, rows x H) with an explicit backward, which recomputes the
    statistics from u in torch ops (so it is itself differentiable: the double backward follows); returns y in u's
    dtype. Used by the gated records' mutants (tests/mutants/_gated.py) on the gated input."""

    @staticmethod
    def statistics(u, eps, group_size, bug):
        rows, hidden = u.shape
        ug = grouped(u, rows, hidden, group_size, bug)
        rstd = torch.rsqrt(ug.square().mean(dim=2, keepdim=True) + eps)
        return ug * rstd, rstd

    @staticmethod
    def forward(ctx, u, weight, eps, group_size, bug):
        xhat, _ = GroupedRMSNorm.statistics(u, eps, group_size, bug)
        scale = scale_of(weight, xhat, group_size, bug)
        ctx.save_for_backward(u, weight)
        ctx.eps, ctx.group_size, ctx.bug = eps, group_size, bug
        return ungrouped(xhat if scale is None else xhat * scale, u.shape, bug)

    @staticmethod
    def backward(ctx, dy):
        u, weight = ctx.saved_tensors
        bug, group_size = ctx.bug, ctx.group_size
        xhat, rstd = GroupedRMSNorm.statistics(u, ctx.eps, group_size, bug)
        rows, hidden = dy.shape
        dyg = grouped(dy, rows, hidden, group_size, bug)
        scale = scale_of(weight, xhat, group_size, bug)
        g = dyg if scale is None else dyg * scale
        if bug == "dx_row_mean":
            h = (g * xhat).reshape(rows, -1).mean(dim=1).reshape(rows, 1, 1)
        else:
            h = (g * xhat).mean(dim=2, keepdim=True)
        du = ungrouped(rstd * (g - xhat * h), dy.shape, bug)
        dweight = None
        if weight is not None:
            products = dyg * xhat
            if bug == "weight_by_position" and group_size is not None:
                dweight = products.sum(dim=(0, 1)).repeat(hidden // group_size)
            else:
                dweight = ungrouped(products, dy.shape, bug).sum(dim=0)
            dweight = dweight.reshape(weight.shape).to(weight.dtype)
        return du, dweight, None, None, None


def fused(bug: str | None = None):
    def grouped_rms_norm(input, normalized_shape, weight=None, eps=None, group_size=None):
        acc = accumulation_dtype(input.dtype)
        eps = default_eps(input.dtype) if eps is None else eps
        k = len(normalized_shape)
        u = input.to(acc).reshape(prod(input.shape[: input.dim() - k]), -1)
        return GroupedRMSNorm.apply(u, weight, eps, group_size, bug).reshape(input.shape).to(input.dtype)
    grouped_rms_norm.__qualname__ = bug or "fused"
    return grouped_rms_norm


def composed_norm(x, normalized_shape, weight, eps, group_size):
    """The textbook RMSNorm of each group (x in the accumulation dtype), the weight over the row after it."""
    if group_size is None:
        return textbook(x, normalized_shape, weight, eps)
    k = len(normalized_shape)
    groups = x.flatten(x.dim() - k).unflatten(-1, (-1, group_size))
    y = textbook(groups, (group_size,), None, eps).flatten(-2).unflatten(-1, tuple(normalized_shape))
    return y if weight is None else y * weight


def composed(input, normalized_shape, weight=None, eps=None, group_size=None):
    acc = accumulation_dtype(input.dtype)
    eps = default_eps(input.dtype) if eps is None else eps
    w = None if weight is None else weight.to(acc)
    return composed_norm(input.to(acc), normalized_shape, w, eps, group_size).to(input.dtype)


def _record(name, fn, what):
    return test_code("grouped_rmsnorm", name, fn, what, rmsnorm.TORCHS)


MUTANTS = {bug: _record(bug, fused(bug), f"mutant: {bug}") for bug in BUGS}
CORRECT = {"composed": _record("composed", composed, "textbook RMSNorm on each group, through autograd"),
           "fused": _record("fused", fused(), "one autograd.Function, float32 inside")}
globals().update(MUTANTS | CORRECT)
