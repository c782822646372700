"""Every op's math written once over its normalisation sets: eval mode and the double backward.

Arrays are in the grouped view (N, K, L, S) of normcheck.numerics.sets, sets reduced over `axes`; γ and β are
broadcast against it (per channel, per element of D, ...). y = γ·x̂ + β with x̂ = (x − μ)·r, r = 1/sqrt(σ² + eps);
μ and σ² are the set's own (training: μ = mean(x), σ² = mean((x − μ)²); uncentred ops such as RMSNorm hold μ = 0)
or constants (eval mode: the running statistics).

Eval mode (first order). With μ and r constant, y is affine in x: dx = γ·r·dy, dγ = Σ dy·x̂, dβ = Σ dy.

Double backward. Let f(x, γ, β) = ⟨dy, y⟩; its gradient is the first-order backward (dx, dγ, dβ). For
cotangents t = (ddx, ddγ, ddβ) of it, L = ⟨t, ∇f⟩ = ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩, and
  ∂L/∂(x, γ, β) = H·t  (H, the Hessian of f, is symmetric) = the derivative of (dx, dγ, dβ) along t,
  ∂L/∂dy = J·t         (∇f is linear in dy: L = ⟨dy, J·t⟩, J the Jacobian of y) = the derivative of y along t.
So every second-order output is a directional derivative (forward mode) through the first-order formulas, taken
here in closed form; ∂L/∂β = 0. With ẋ = ddx, γ̇ = ddγ, β̇ = ddβ (zero for an input that does not require grad):
  training:  ḋ = ẋ − mean(ẋ)  (uncentred: ẋ),  ṙ = −r³·mean((x − μ)·ḋ),  x̂̇ = ḋ·r + (x − μ)·ṙ
  eval:      x̂̇ = ẋ·r
  d2dy = γ·x̂̇ + γ̇·x̂ + β̇
  g = γ·dy, ġ = γ̇·dy, h = mean(g·x̂): dx = r·(g − mean(g) − x̂·h)  (eval: r·g)
  d2x = ṙ·(g − mean(g) − x̂·h) + r·(ġ − mean(ġ) − x̂̇·h − x̂·mean(ġ·x̂ + g·x̂̇))   (eval: r·ġ)
  d2weight = Σ dy·x̂̇   (over the elements that share a parameter)
The means of g and ġ are absent for an uncentred op. tests/test_reference.py checks these against central finite
differences of the first-order reference and against torch's float64 double backward.

The formulas only add, subtract and multiply their values and call `ar` for the rest (`ar.mean`, `ar.param_sum`,
`ar.rsqrt`), so one spelling serves three evaluations: float64 (the reference), the case's accumulation precision
(normcheck's same-precision baseline) and a running-error analysis (the tolerance model's bound for them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Arithmetic:
    """How `second_order` and `eval_mode` reduce: a set's statistic (its mean, or its total), sums over the elements
    sharing a parameter, and r = 1/sqrt(var + eps) (or 1/max(sqrt(var), eps)); `either(a, b)`: two spellings of one
    value, equal in exact arithmetic, that a kernel may write (a's value; a running error covers both); `moving(var,
    eps)`: 1 where r moves with var, 0 where eps floors it (None: it floors nothing)."""
    mean: Callable[[Any], Any]
    param_sum: Callable[[Any], Any]
    rsqrt: Callable[[Any, float], Any]
    either: Callable[[Any, Any], Any] = lambda a, b: a
    moving: Callable[[Any, float], Any] = lambda var, eps: None


def numpy_arithmetic(view) -> Arithmetic:
    """NumPy arrays in their own dtype (float64 for the reference), reduced as `view` (numerics.sets.SetView) says:
    each set's statistic (its mean, or its total) and the sum over each parameter's elements."""
    def rsqrt(var, eps):
        with np.errstate(divide="ignore"):
            return 1 / np.sqrt(view.rsqrt_operand(var, eps))  # a Python eps rounds to the array's dtype, as in torch
    return Arithmetic(view.reduce, view.channel_sum, rsqrt, moving=view.moving)


def eval_mode(x, dy, gamma, beta, mu, var, eps: float, ar: Arithmetic, epilogue=None) -> dict:
    """y and the first-order gradients with the constant statistics μ, σ² (the running ones).

    `epilogue` (reference.stages.ElementFunction, an activation's): z = f(y) is the output and dz·f'(y) the gradient reaching the norm."""
    r = ar.rsqrt(var, eps)
    xhat = (x - mu) * r
    y = gamma * xhat + beta
    if epilogue is not None:
        dy = dy * epilogue.grad(y)
        y = epilogue.f(y)
    return {"y": y, "dx": gamma * r * dy, "dweight": ar.param_sum(dy * xhat), "dbias": ar.param_sum(dy)}


SECOND_ORDER = ("d2x", "d2weight", "d2dy")


def second_order(x, dy, gamma, ddx, ddweight, ddbias, eps: float, ar: Arithmetic, *, centred: bool = True,
                 stats: tuple | None = None, wanted=SECOND_ORDER) -> dict:
    """The `wanted` ones of d2x, d2weight and d2dy: the gradients of ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩
    (module docstring). Only those are computed: forward mode's y JVP (d2dy) needs none of d2x's backward terms.

    `stats`: None for the batch's statistics (training), or the constant (μ, σ²) of eval mode. The cotangents
    are broadcast like x, γ and β (zeros for a gradient not asked for)."""
    moving = None
    if stats is None:
        mu = ar.mean(x) if centred else None
        dev = x - mu if centred else x
        var = ar.mean(dev * dev)
        r = ar.rsqrt(var, eps)
        moving = ar.moving(var, eps)
    else:
        mu, var = stats
        dev = x - mu
        r = ar.rsqrt(var, eps)

    def held(a):
        """a where r moves with the statistics, 0 in a set whose r eps floors (its statistics then enter nowhere)."""
        return a if moving is None else a * moving
    xhat = dev * r
    out = {}
    if stats is None:
        d_dot = ddx - ar.mean(ddx) if centred else ddx
        # mean((x − μ)·ḋ) = mean((x − μ)·ẋ) in exact arithmetic, and a kernel may write either (as the backward's
        # h = mean(g·x̂) takes g uncentred); the uncentred product's rounding carries mean(x − μ)'s times mean(ẋ)
        r_dot = held(r * r * r * ar.either(ar.mean(dev * d_dot), ar.mean(dev * ddx)) * -1.0)
        xhat_dot = d_dot * r + dev * r_dot
        if "d2x" in wanted:
            g, g_dot = gamma * dy, ddweight * dy
            h = held(ar.mean(g * xhat))
            h_dot = held(ar.mean(g_dot * xhat + g * xhat_dot))
            if centred:
                inner = g - ar.mean(g) - xhat * h
                inner_dot = g_dot - ar.mean(g_dot) - xhat_dot * h - xhat * h_dot
            else:
                inner = g - xhat * h
                inner_dot = g_dot - xhat_dot * h - xhat * h_dot
            out["d2x"] = r_dot * inner + r * inner_dot
    else:
        xhat_dot = ddx * r
        if "d2x" in wanted:
            out["d2x"] = r * (ddweight * dy)
    if "d2weight" in wanted:
        out["d2weight"] = ar.param_sum(dy * xhat_dot)
    if "d2dy" in wanted:
        out["d2dy"] = gamma * xhat_dot + ddweight * xhat + ddbias
    return out
