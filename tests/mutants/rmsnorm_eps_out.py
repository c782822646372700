"""Mutants and correct implementations of RMSNorm with eps outside the root, under the contract fn(input,
normalized_shape, weight, eps): input / (√mean(input²) + eps) · weight over the last K dims.

The bug classes of such layers and of kernels written for them: eps inside the root (F.rms_norm's rsqrt(ms + eps)),
eps dropped from the backward (r = 1/rms there), F.rms_norm's backward reused (dx = r·(g − x̂·mean(g·x̂)): without
λ = 1 + eps/rms), the rms treated as a constant (x / rms.detach()), the norm without its H^(−1/2) (‖x‖ + eps), the
sum of squares accumulated in half precision, and the rms spelled torch.sqrt(x.pow(2).mean()) through autograd, whose
derivative at a zero row is inf·0 = NaN where the exact dx is g/eps.

Two correct styles: `composed` (torch.linalg.vector_norm through autograd, float32 inside) and `fused` (one
autograd.Function as a fused kernel is written: float32 inside, an explicit backward in torch ops on recomputed
statistics, itself differentiable: dx = r·(g − x·r·mean(g·x)/rms), its last term 0 in a zero row).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code
from ._rows import reciprocal, root, rows_of

BUGS = ("eps_inside_root", "eps_dropped_in_backward", "rms_norm_backward", "detached_rms", "norm_without_scale",
        "half_statistic", "sqrt_of_mean_square")


def _statistics(u, eps, bug=None):
    """(rms, r) per row of u (rows, H), `bug` the way it goes wrong."""
    squares = (u.to(torch.float16) * u.to(torch.float16)).sum(1, keepdim=True).to(u.dtype) \
        if bug == "half_statistic" else (u * u).sum(1, keepdim=True)
    ms = squares if bug == "norm_without_scale" else squares / u.shape[1]
    rms = root(ms)
    r = (ms + eps).rsqrt() if bug == "eps_inside_root" else 1 / (rms + eps)
    return rms, r


class RMSNormEpsOutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, weight, eps, bug):
        _, r = _statistics(u, eps, bug)
        ctx.save_for_backward(u, weight)
        ctx.eps, ctx.bug = eps, bug
        y = u * r
        return y if weight is None else y * weight.to(u.dtype)

    @staticmethod
    def backward(ctx, dy):
        u, weight = ctx.saved_tensors
        bug, eps = ctx.bug, ctx.eps
        rms, r = _statistics(u, eps, bug)
        inv_rms = reciprocal(rms)
        if bug == "eps_dropped_in_backward":
            r = inv_rms
        g = dy if weight is None else dy * weight.to(u.dtype)
        # dx = r·(g − x·c): c = r·mean(g·x)/rms (x̂·λ·mean(g·x̂), λ = (rms + eps)/rms), or the bug's
        products = (g * u).sum(1, keepdim=True) / (1 if bug == "norm_without_scale" else u.shape[1])
        if bug == "detached_rms":
            c = torch.zeros_like(rms)
        elif bug in ("rms_norm_backward", "eps_inside_root"):  # λ = 1 (eps_inside_root's own form, consistently)
            c = products * r * r
        else:
            c = products * r * inv_rms
        du = r * (g - u * c)
        dweight = None if weight is None else (dy * u * r).sum(0).reshape(weight.shape).to(weight.dtype)
        return du, dweight, None, None


def fused(bug: str | None = None):
    def rms_norm_eps_out(input, normalized_shape, weight=None, eps=1e-6):
        u = rows_of(input, normalized_shape).to(accumulation_dtype(input.dtype))
        w = None if weight is None else weight.reshape(-1)
        return RMSNormEpsOutFunction.apply(u, w, eps, bug).reshape(input.shape).to(input.dtype)
    rms_norm_eps_out.__qualname__ = bug or "fused"
    return rms_norm_eps_out


def composed(input, normalized_shape, weight=None, eps=1e-6, bug=None):
    """x / (vector_norm(x) / √H + eps) · w through autograd, float32 inside (`bug`: the sqrt spelling)."""
    x = input.to(accumulation_dtype(input.dtype))
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    if bug == "sqrt_of_mean_square":
        rms = torch.sqrt(x.pow(2).mean(dims, keepdim=True))
    else:
        rms = torch.linalg.vector_norm(x, dim=dims, keepdim=True) / prod(normalized_shape) ** 0.5
    y = x / (rms + eps)
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


def sqrt_of_mean_square(input, normalized_shape, weight=None, eps=1e-6):
    return composed(input, normalized_shape, weight, eps, bug="sqrt_of_mean_square")


def _record(name, fn, what):
    return test_code("rmsnorm_eps_out", name, fn, what, {})


MUTANTS = {bug: _record(bug, fused(bug), f"mutant: {bug}") for bug in BUGS if bug != "sqrt_of_mean_square"}
MUTANTS["sqrt_of_mean_square"] = _record("sqrt_of_mean_square", sqrt_of_mean_square,
                                         "mutant: torch.sqrt(x.pow(2).mean()) through autograd")
CORRECT = {"composed": _record("composed", composed, "torch.linalg.vector_norm through autograd, float32 inside"),
           "fused": _record("fused", fused(), "one autograd.Function, float32 inside")}
globals().update(MUTANTS | CORRECT)
