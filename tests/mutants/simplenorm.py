"""Mutants and correct implementations of SimpleNorm (timm), under the contract fn(input, normalized_shape, weight,
eps): input · rsqrt(var(input) + eps) · weight over the last K dims, var unbiased (Σ(x − μ)²/(H − 1)), about the mean,
input itself not centred.

The bug classes of such layers and of kernels written for them: the biased variance (torch.var(unbiased=False),
Σd²/H), x centred as LayerNorm centres it ((x − μ)·r: a LayerNorm without bias), the statistic uncentred (Σx²/(H − 1):
RMSNorm's mean of squares with the unbiased divisor), eps outside the root (1/(std + eps)), the backward written with
x where the statistic's derivative has x − μ (dx = r·(g − x·r·h): RMSNorm's backward reused), the variance treated
as a constant (x · rsqrt(var.detach() + eps)), and the sum of squared deviations accumulated in half precision.

Two correct styles: `composed` (torch.var_mean through autograd, float32 inside) and `fused` (one autograd.Function
as a fused kernel is written: float32 inside, an explicit backward in torch ops on recomputed statistics, so that it
is itself differentiable; dx = r·(g − (x − μ)·r²·Σ(g·x)/(H − 1))).
"""
from __future__ import annotations

import torch

from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code
from ._rows import reciprocal, root, rows_of

BUGS = ("biased_var", "centred_output", "uncentred_statistic", "eps_outside_root", "rms_norm_backward",
        "detached_var", "half_statistic")


def _statistics(u, eps, bug=None):
    """(d, std, r) per row of u (rows, H): the deviations the statistic is formed from, √s and r, `bug` the way it
    goes wrong."""
    d = u if bug == "uncentred_statistic" else u - u.mean(1, keepdim=True)
    squares = (d.to(torch.float16) * d.to(torch.float16)).sum(1, keepdim=True).to(u.dtype) \
        if bug == "half_statistic" else (d * d).sum(1, keepdim=True)
    var = squares / (u.shape[1] - (0 if bug == "biased_var" else 1))
    std = root(var)
    r = 1 / (std + eps) if bug == "eps_outside_root" else (var + eps).rsqrt()
    return d, std, r


class SimpleNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, weight, eps, bug):
        d, _, r = _statistics(u, eps, bug)
        ctx.save_for_backward(u, weight)
        ctx.eps, ctx.bug = eps, bug
        y = (d if bug == "centred_output" else u) * r
        return y if weight is None else y * weight.to(u.dtype)

    @staticmethod
    def backward(ctx, dy):
        u, weight = ctx.saved_tensors
        bug, eps = ctx.bug, ctx.eps
        d, std, r = _statistics(u, eps, bug)
        divisor = u.shape[1] - (0 if bug == "biased_var" else 1)
        g = dy if weight is None else dy * weight.to(u.dtype)
        out = d if bug == "centred_output" else u  # (what y scales)
        # dx = r·(g − d·c), c = r²·Σ(g·x)/(H − 1) (d·r times h = Σ(g·x̂)/(H − 1)), or the bug's
        c = (g * out).sum(1, keepdim=True) / divisor * r * r
        if bug == "eps_outside_root":  # its own form, consistently: λ = (std + eps)/std
            inv_std = reciprocal(std)
            c = c * (std + eps) * inv_std
        if bug == "detached_var":
            c = torch.zeros_like(c)
        gbar = g.mean(1, keepdim=True) if bug == "centred_output" else 0
        du = r * (g - gbar - (u if bug == "rms_norm_backward" else d) * c)
        dweight = None if weight is None else (dy * out * r).sum(0).reshape(weight.shape).to(weight.dtype)
        return du, dweight, None, None


def fused(bug: str | None = None):
    def simple_norm(input, normalized_shape, weight=None, eps=1e-6):
        u = rows_of(input, normalized_shape).to(accumulation_dtype(input.dtype))
        w = None if weight is None else weight.reshape(-1)
        return SimpleNormFunction.apply(u, w, eps, bug).reshape(input.shape).to(input.dtype)
    simple_norm.__qualname__ = bug or "fused"
    return simple_norm


def composed(input, normalized_shape, weight=None, eps=1e-6):
    """x · rsqrt(var + eps) · w with torch.var_mean (unbiased) through autograd, float32 inside."""
    x = input.to(accumulation_dtype(input.dtype))
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    var, _ = torch.var_mean(x, dims, keepdim=True)
    y = x * (var + eps).rsqrt()
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


def _record(name, fn, what):
    return test_code("simplenorm", name, fn, what, {})


MUTANTS = {bug: _record(bug, fused(bug), f"mutant: {bug}") for bug in BUGS}
CORRECT = {"composed": _record("composed", composed, "torch.var_mean through autograd, float32 inside"),
           "fused": _record("fused", fused(), "one autograd.Function, float32 inside")}
globals().update(MUTANTS | CORRECT)
