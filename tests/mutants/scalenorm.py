"""ScaleNorm mutants and correct implementations, under the contract fn(input, normalized_shape, weight, eps): one
scalar gain g (shape (1,)), y = g · x / max(‖x‖, eps) over the last K dims.

The bug classes of ScaleNorm kernels: the row's mean of squares taken for its total (RMSNorm's statistic), eps added
to the norm where it floors it, a backward that treats the norm as a constant (x / norm.detach()), a backward that
forgets the floor (projects a floored row as if its norm moved), the gain's gradient left as one row's partial sum
(every program stores its sum in the one slot instead of adding to it), and the sum of squares accumulated in the
input's half precision.

Two correct styles: `composed` (torch ops through autograd, float32 inside) and `fused` (one autograd.Function as a
fused kernel is written: float32 inside, an explicit backward in torch ops, so that it is itself differentiable).
"""
from __future__ import annotations

import torch

from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code
from ._rows import rows_of

BUGS = ("rms_statistic", "eps_added", "detached_norm", "floor_ignored_in_backward", "dg_one_row",
        "half_sum_of_squares")
FOLLOWS = {"weight_offset": 0.0, "eps_at": "floor"}


def rstd_of(u, eps, bug=None):
    """1 / max(‖u‖, eps) per row of u (rows, H), and whether eps floors it; `bug` the way it goes wrong."""
    squares = (u.to(torch.float16) ** 2).sum(1, keepdim=True).to(u.dtype) if bug == "half_sum_of_squares" \
        else (u * u).sum(1, keepdim=True)
    if bug == "rms_statistic":
        squares = squares / u.shape[1]
    if bug == "eps_added":
        return 1 / (squares.sqrt() + eps), torch.zeros_like(squares, dtype=torch.bool)
    # (the floor on the square: rsqrt of it is differentiable at a zero row, as a norm is not)
    return torch.rsqrt(squares.clamp(min=eps * eps)), squares < eps * eps


class ScaleNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, weight, eps, bug):
        r, _ = rstd_of(u, eps, bug)
        ctx.save_for_backward(u, weight)
        ctx.eps, ctx.bug = eps, bug
        y = u * r
        return y if weight is None else y * weight.to(u.dtype)

    @staticmethod
    def backward(ctx, dy):
        u, weight = ctx.saved_tensors
        bug = ctx.bug
        r, floored = rstd_of(u, ctx.eps, bug)
        xhat = u * r
        g = dy if weight is None else dy * weight.to(u.dtype)
        h = (g * xhat).sum(1, keepdim=True)
        if bug == "rms_statistic":
            h = h / u.shape[1]
        if bug == "detached_norm":
            h = torch.zeros_like(h)
        elif bug != "floor_ignored_in_backward":
            h = torch.where(floored, torch.zeros_like(h), h)
        du = r * (g - xhat * h)
        dweight = None
        if weight is not None:
            products = dy * xhat
            dweight = (products[-1:] if bug == "dg_one_row" else products).sum().reshape(weight.shape)
            dweight = dweight.to(weight.dtype)
        return du, dweight, None, None


def fused(bug: str | None = None):
    def scale_norm(input, normalized_shape, weight=None, eps=1e-5):
        u = rows_of(input, normalized_shape).to(accumulation_dtype(input.dtype))
        return ScaleNormFunction.apply(u, weight, eps, bug).reshape(input.shape).to(input.dtype)
    scale_norm.__qualname__ = bug or "fused"
    return scale_norm


def composed(input, normalized_shape, weight=None, eps=1e-5):
    """x · rsqrt(max(Σx², eps²)) · g in torch ops (the floor taken on the square: no norm's derivative at 0)."""
    u = rows_of(input, normalized_shape).to(accumulation_dtype(input.dtype))
    y = u * torch.rsqrt((u * u).sum(1, keepdim=True).clamp(min=eps * eps))
    if weight is not None:
        y = y * weight.to(u.dtype)
    return y.reshape(input.shape).to(input.dtype)


def _record(name, fn, what):
    return test_code("scalenorm", name, fn, what, FOLLOWS)


MUTANTS = {bug: _record(bug, fused(bug), f"mutant: {bug}") for bug in BUGS}
CORRECT = {"composed": _record("composed", composed, "x · rsqrt(max(Σx², eps²)) · g through autograd"),
           "fused": _record("fused", fused(), "one autograd.Function, float32 inside")}
globals().update(MUTANTS | CORRECT)
