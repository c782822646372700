"""Every op's math written once over its normalisation sets: eval mode and the double backward.

Arrays are in the grouped view (N, K, L, S) of normcheck.numerics.sets, sets reduced over `axes`; γ and β are
broadcast against it (per channel, per element of D, ...). y = γ·x̂ + β with x̂ = d·r, d = x − μ, r = φ(s) of the
set's statistic s = Σd²/D in the view's statistic form (numerics.statistics: φ(s) = 1/sqrt(s + eps) and D = M unless
an op declares another); μ and s are the set's own (training: μ = mean(x), s the statistic of d²; uncentred ops such
as RMSNorm hold μ = 0) or constants (eval mode: the running statistics).

Training mode (first order). With g = γ·dy, ḡ = mean(g), h = Σ(g·x̂)/D (the statistic of g·x̂) and λ = −2φ'(s)/r³
(the form's slope: 1 for φ = 1/sqrt(s + eps)): dx = r·(g − ḡ − λ·x̂·h), dγ = Σ dy·x̂, dβ = Σ dy.

Eval mode (first order). With μ and r constant, y is affine in x: dx = γ·r·dy, dγ = Σ dy·x̂, dβ = Σ dy.

Double backward. Let f(x, γ, β) = ⟨dy, y⟩; its gradient is the first-order backward (dx, dγ, dβ). For
cotangents t = (ddx, ddγ, ddβ) of it, L = ⟨t, ∇f⟩ = ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩, and
  ∂L/∂(x, γ, β) = H·t  (H, the Hessian of f, is symmetric) = the derivative of (dx, dγ, dβ) along t,
  ∂L/∂dy = J·t         (∇f is linear in dy: L = ⟨dy, J·t⟩, J the Jacobian of y) = the derivative of y along t.
So every second-order output is a directional derivative (forward mode) through the first-order formulas, taken
here in closed form; ∂L/∂β = 0. With ẋ = ddx, γ̇ = ddγ, β̇ = ddβ (zero for an input that does not require grad):
  training:  ḋ = ẋ − mean(ẋ)  (uncentred: ẋ),  w = Σ(d·ḋ)/D,  ṙ = −λ·r³·w,  x̂̇ = ḋ·r + d·ṙ
  eval:      x̂̇ = ẋ·r   (x̂ = (x − μ)·r, or folded, x·r − μ·r: either spelling)
  d2dy = γ·x̂̇ + γ̇·x̂ + β̇
  g = γ·dy, ġ = γ̇·dy, H = λ·h: dx = r·(g − mean(g) − x̂·H)  (eval: r·g)
  Ḣ = λ·Σ(ġ·x̂ + g·x̂̇)/D + λ̇·h,  λ̇ = 2λ'(s)·w  (the form's slope_rate; none where λ is constant in s)
  d2x = ṙ·(g − mean(g) − x̂·H) + r·(ġ − mean(ġ) − x̂̇·H − x̂·Ḣ)   (eval: r·ġ)
  d2weight = Σ dy·x̂̇   (over the elements that share a parameter)
The means of g and ġ are absent for an uncentred op. Where an uncentred op's statistic is about the set's mean
(StatisticForm.about_mean: timm's SimpleNorm, y = γ·x·r, s = Σ(x − μ)²/D) the output's x̂ = x·r and the statistic's
d·r differ: h, x̂̇, d2dy and d2weight take x̂, and the term x̂·H of dx and d2x (its tangent x̂̇·H + x̂·Ḣ) is the
statistic's d·r (ḋ·r + d·ṙ, ḋ = ẋ − mean(ẋ)), as s's derivative by x is 2d/D. tests/test_reference.py checks these
against central finite differences of the first-order reference and against torch's float64 double backward.

The formulas only add, subtract and multiply their values and call `ar` for the rest (`ar.mean`, `ar.statistic`,
`ar.param_sum`, and `ar.apply` for the form's functions of s), so one spelling serves three evaluations: float64 (the
reference), the case's accumulation precision (normcheck's same-precision baseline) and a running-error analysis (the
tolerance model's bound for them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..numerics.statistics import STANDARD, StatisticForm
from ._moments import as_working, working


@dataclass(frozen=True)
class Arithmetic:
    """How `training`, `second_order` and `eval_mode` reduce and apply functions: a set's mean (μ, ḡ: what centring
    subtracts), its statistic of an array (Σ/D in the statistic form `form`: the mean, the total, ...), sums over
    the elements sharing a parameter; `apply(value, error, s, rounded=True)`: an element-wise function of a set's
    statistic (value(s) on NumPy arrays; error(value, s, δs), how far an error δs in s moves it, for a running
    error, which adds the value's own rounding unless it is exact, `rounded=False`: a mask); `either(a, b)`: two
    spellings of one value, equal in exact arithmetic, that a kernel may write (a's value; a running error covers
    both)."""
    mean: Callable[[Any], Any]
    statistic: Callable[[Any], Any]
    param_sum: Callable[[Any], Any]
    apply: Callable[..., Any]
    either: Callable[[Any, Any], Any] = lambda a, b: a
    form: StatisticForm = STANDARD


def numpy_arithmetic(view) -> Arithmetic:
    """NumPy arrays in their own dtype (float64 for the reference), reduced as `view` (numerics.sets.SetView) says:
    each set's mean and statistic (in its form) and the sum over each parameter's elements."""
    def apply(value, error, s, rounded=True):
        return value(s)
    return Arithmetic(view.mean, view.reduce, view.channel_sum, apply, form=view.form)


def statistic_deviations(x, dev, ar: Arithmetic, centred: bool):
    """The deviations the statistic is formed from: the output's own `dev` (x − μ, or x uncentred), or x − μ where an
    uncentred norm's form takes its statistic about the mean (StatisticForm.about_mean)."""
    return x - ar.mean(x) if ar.form.centres(centred) and not centred else dev


def training(x, dy, gamma, beta, eps: float, ar: Arithmetic, *, centred: bool = True) -> dict:
    """y, the first-order gradients and the set's mean and r with the batch's own statistics, in the statistic form
    of `ar` (module docstring: dx = r·(g − ḡ − λ·x̂·h)); an op whose form is its only difference from the others
    takes its reference from here. A zero set with eps = 0 gives 0·inf = NaN, as in torch."""
    form = ar.form
    mu = ar.mean(x) if centred else None
    dev = x - mu if centred else x
    spread = statistic_deviations(x, dev, ar, centred)
    s = ar.statistic(spread * spread)
    r = form.r(ar, s, eps)
    slope = form.slope(ar, s, eps)
    with np.errstate(invalid="ignore"):
        xhat = dev * r
        shat = xhat if spread is dev else spread * r
        g = gamma * dy
        h = ar.statistic(g * xhat)
        h = h if slope is None else h * slope
        inner = g - ar.mean(g) - shat * h if centred else g - shat * h
        return {"y": gamma * xhat + beta, "dx": r * inner, "dweight": ar.param_sum(dy * xhat),
                "dbias": ar.param_sum(dy), "mean": mu, "rstd": r}


def reference(view, x, dy, weight, bias, eps: float, *, offset: float = 0.0, centred: bool = True) -> dict:
    """The training-mode reference of a norm that is its view's sets and statistic form alone (`training`), from
    x-shaped x and dy and the parameters as given (None where absent; γ = weight + offset): y and dx shaped like x,
    dweight and dbias like the parameters (None without them), the mean and r one per set (view.stats_shape). Computes
    in the working precision (float64; the same-precision baseline's inside `working_precision`)."""
    x, dy = view.group(as_working(x)), view.group(as_working(dy))
    ones = np.ones(view.param_shape, working())
    gamma = ones if weight is None else as_working(weight).reshape(view.param_shape) + float(offset)
    beta = 0 * ones if bias is None else as_working(bias).reshape(view.param_shape)
    out = training(x, dy, view.per_channel_values(gamma), view.per_channel_values(beta), eps, numpy_arithmetic(view),
                   centred=centred)
    stats = {"mean": out["mean"] if centred else np.zeros(view.stats_shape, working()), "rstd": out["rstd"]}
    return {"y": view.ungroup(out["y"]), "dx": view.ungroup(out["dx"]),
            "dweight": None if weight is None else out["dweight"].reshape(np.shape(weight)),
            "dbias": None if bias is None else out["dbias"].reshape(np.shape(bias)),
            **{name: a.reshape(view.stats_shape) for name, a in stats.items()}}


def eval_mode(x, dy, gamma, beta, mu, var, eps: float, ar: Arithmetic, epilogue=None) -> dict:
    """y and the first-order gradients with the constant statistics μ, σ² (the running ones).

    `epilogue` (reference.stages.ElementFunction, an activation's): z = f(y) is the output and dz·f'(y) the gradient reaching the norm."""
    r = ar.form.r(ar, var, eps)
    xhat = (x - mu) * r
    y = gamma * xhat + beta
    if epilogue is not None:
        dy = dy * epilogue.grad(y)
        y = epilogue.f(y)
    return {"y": y, "dx": gamma * r * dy, "dweight": ar.param_sum(dy * xhat), "dbias": ar.param_sum(dy)}


SECOND_ORDER = ("d2x", "d2weight", "d2dy")


def second_order(x, dy, gamma, ddx, ddweight, ddbias, eps: float, ar: Arithmetic, *, centred: bool = True,
                 stats: tuple | None = None, wanted=SECOND_ORDER, seen=None) -> dict:
    """The `wanted` ones of d2x, d2weight and d2dy: the gradients of ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩
    (module docstring). Only those are computed: forward mode's y JVP (d2dy) needs none of d2x's backward terms.

    `stats`: None for the batch's statistics (training), or the constant (μ, σ²) of eval mode. The cotangents
    are broadcast like x, γ and β (zeros for a gradient not asked for). `seen(x̂, x, r)`: x̂ as the weight multiply
    sees it, where a casting chain rounds it first (the first-order reference's `rounding`: y = γ·seen(x̂), so the
    weight's direction meets seen(x̂) in d2dy; autograd passes derivatives through the rounding unchanged)."""
    form = ar.form
    slope = rate = None
    if stats is None:
        mu = ar.mean(x) if centred else None
        dev = x - mu if centred else x
        spread = statistic_deviations(x, dev, ar, centred)
        s = ar.statistic(spread * spread)
        r = form.r(ar, s, eps)
        slope, rate = form.slope(ar, s, eps), form.slope_rate(ar, s, eps)
    else:
        mu, s = stats
        dev = spread = x - mu
        r = form.r(ar, s, eps)
    # (eval mode: x̂ = (x − μ)·r, or as kernels fold the constant statistics, x·r − μ·r with the two products rounded
    # apart, as the first-order y's bound has it: a frozen BatchNorm's y = x·(γr) + (β − μγr) carries it into y's JVP)
    xhat = dev * r if stats is None else ar.either(dev * r, x * r - mu * r)

    def held(a):
        """λ·a: a itself where λ = 1, 0 in a set whose r eps floors (its statistics then enter nowhere)."""
        return a if slope is None else a * slope
    out = {}
    if stats is None:
        d_dot = ddx - ar.mean(ddx) if centred else ddx
        spread_dot = d_dot if spread is dev else ddx - ar.mean(ddx)
        # Σ(d·ḋ) = Σ(d·ẋ) in exact arithmetic, and a kernel may write either (as the backward's h = Σ(g·x̂)/D takes
        # g uncentred); the uncentred product's rounding carries mean(x − μ)'s times mean(ẋ)
        w = ar.either(ar.statistic(spread * spread_dot), ar.statistic(spread * ddx))
        r_dot = held(r * r * r * w * -1.0)
        xhat_dot = d_dot * r + dev * r_dot
        if "d2x" in wanted:
            # (the statistic's d·r and its tangent, where they are not x̂'s: module docstring)
            shat, shat_dot = (xhat, xhat_dot) if spread is dev else (spread * r, spread_dot * r + spread * r_dot)
            g, g_dot = gamma * dy, ddweight * dy
            h_own = ar.statistic(g * xhat)
            h = held(h_own)
            h_dot = held(ar.statistic(g_dot * xhat + g * xhat_dot))
            if rate is not None:  # λ̇·h, where λ varies with s
                h_dot = h_dot + rate * w * h_own
            if centred:
                inner = g - ar.mean(g) - shat * h
                inner_dot = g_dot - ar.mean(g_dot) - shat_dot * h - shat * h_dot
            else:
                inner = g - shat * h
                inner_dot = g_dot - shat_dot * h - shat * h_dot
            out["d2x"] = r_dot * inner + r * inner_dot
    else:
        xhat_dot = ddx * r
        if "d2x" in wanted:
            out["d2x"] = r * (ddweight * dy)
    if "d2weight" in wanted:
        out["d2weight"] = ar.param_sum(dy * xhat_dot)
    if "d2dy" in wanted:
        out["d2dy"] = gamma * xhat_dot + ddweight * (xhat if seen is None else seen(xhat, x, r)) + ddbias
    return out
