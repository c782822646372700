"""Mutants and correct implementations of the annotated transformer's LayerNorm, under the contract fn(input,
normalized_shape, weight, bias, eps): a_2·(x − mean)/(x.std() + eps) + b_2 over the last K dims, std unbiased
(Σd²/(H − 1)), eps outside the root.

The bug classes of such layers and of kernels written for them: the biased std (F.layer_norm's Σd²/H), eps inside the
root (F.layer_norm's √(var + eps)), eps dropped from the backward (r = 1/std there), F.layer_norm's backward reused
(dx = r·(g − ḡ − x̂·mean(g·x̂)): neither the unbiased statistic nor eps outside the root, λ = 1 + eps/std, in it), the
std treated as a constant (x / std.detach()), and the sum of squared deviations accumulated in half precision.

Two correct styles: `composed` (torch.std_mean through autograd, float32 inside) and `fused` (one autograd.Function
as a fused kernel is written: float32 inside, an explicit backward in torch ops on recomputed statistics, so that it
is itself differentiable; dx = r·(g − ḡ − (x − μ)·Σ(g·(x − μ))/((H − 1)·std)), its last term 0 where std = 0).
"""
from __future__ import annotations

import torch

from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code
from ._rows import reciprocal, root, rows_of

BUGS = ("biased_std", "eps_inside_root", "eps_dropped_in_backward", "layer_norm_backward", "detached_std",
        "half_statistic")


def _statistics(u, eps, bug=None):
    """(x − μ, std, r) per row of u (rows, H), `bug` the way it goes wrong."""
    d = u - u.mean(1, keepdim=True)
    divisor = u.shape[1] - (0 if bug == "biased_std" else 1)
    squares = (d.to(torch.float16) * d.to(torch.float16)).sum(1, keepdim=True).to(u.dtype) \
        if bug == "half_statistic" else (d * d).sum(1, keepdim=True)
    var = squares / divisor
    std = root(var)
    r = (var + eps).rsqrt() if bug == "eps_inside_root" else 1 / (std + eps)
    return d, std, r


class LayerNormStdFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, weight, bias, eps, bug):
        d, _, r = _statistics(u, eps, bug)
        ctx.save_for_backward(u, weight, bias)
        ctx.eps, ctx.bug = eps, bug
        y = d * r
        y = y if weight is None else y * weight.to(u.dtype)
        return y if bias is None else y + bias.to(u.dtype)

    @staticmethod
    def backward(ctx, dy):
        u, weight, bias = ctx.saved_tensors
        bug, eps = ctx.bug, ctx.eps
        d, std, r = _statistics(u, eps, bug)
        hidden = u.shape[1]
        inv_std = reciprocal(std)
        if bug == "eps_dropped_in_backward":
            r = inv_std
        g = dy if weight is None else dy * weight.to(u.dtype)
        # dx = r·(g − ḡ − (x − μ)·c): c = r·Σ(g·(x − μ))/((H − 1)·std) (x̂·λh, λ = (std + eps)/std), or the bug's
        products = (g * d).sum(1, keepdim=True)
        if bug == "detached_std":
            c = torch.zeros_like(std)
        elif bug == "layer_norm_backward":  # x̂·mean(g·x̂)
            c = products / hidden * r * r
        elif bug == "eps_inside_root":  # its own form, consistently: λ = 1
            c = products / (hidden - 1) * r * r
        else:
            c = products / (hidden - (0 if bug == "biased_std" else 1)) * r * inv_std
        du = r * (g - g.mean(1, keepdim=True) - d * c)
        xhat = d * r
        dweight = None if weight is None else (dy * xhat).sum(0).reshape(weight.shape).to(weight.dtype)
        dbias = None if bias is None else dy.sum(0).reshape(bias.shape).to(bias.dtype)
        return du, dweight, dbias, None, None


def fused(bug: str | None = None):
    def layer_norm_std(input, normalized_shape, weight=None, bias=None, eps=1e-6):
        u = rows_of(input, normalized_shape).to(accumulation_dtype(input.dtype))
        w = None if weight is None else weight.reshape(-1)
        b = None if bias is None else bias.reshape(-1)
        return LayerNormStdFunction.apply(u, w, b, eps, bug).reshape(input.shape).to(input.dtype)
    layer_norm_std.__qualname__ = bug or "fused"
    return layer_norm_std


def composed(input, normalized_shape, weight=None, bias=None, eps=1e-6):
    """(x − mean) / (std + eps) · w + b with torch.std_mean (unbiased) through autograd, float32 inside."""
    x = input.to(accumulation_dtype(input.dtype))
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    std, mean = torch.std_mean(x, dims, keepdim=True)
    y = (x - mean) / (std + eps)
    if weight is not None:
        y = y * weight.to(x.dtype)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.to(input.dtype)


def _record(name, fn, what):
    return test_code("layernorm_std", name, fn, what, {})


MUTANTS = {bug: _record(bug, fused(bug), f"mutant: {bug}") for bug in BUGS}
CORRECT = {"composed": _record("composed", composed, "torch.std_mean through autograd, float32 inside"),
           "fused": _record("fused", fused(), "one autograd.Function, float32 inside")}
globals().update(MUTANTS | CORRECT)
