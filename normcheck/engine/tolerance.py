"""The error model: how far from the float64 reference a correct implementation may land.

See docs/tolerance.md for the derivation and its calibration. In short, every compared element e
gets an allowance

    allowed_e = max(B_e, K_BASELINE · |baseline_e − ref_e|) + tiny

where B_e is a first-order rounding-error bound built from the formula that produces the element
(which magnitudes enter it, in which precision they are accumulated, over how many terms), and
baseline is a straightforward same-dtype implementation with float32 accumulation (float64 for
float64). The budget ratio |got_e − ref_e| / allowed_e is ≤ 1 for a correct implementation.

Symbols (per normalisation set of M elements): μ, σ² (biased), r = 1/sqrt(σ² + eps), x̂ = (x − μ)·r,
g = γ·dy, ḡ = mean(g), h = mean(g·x̂). u_a is the unit roundoff of the accumulation precision,
u_o that of the tensor's storage dtype, u_s that of the moments (the accumulation precision, or
the parameter dtype when that is coarser: torch's CPU kernels keep the saved mean/invstd of a plain
f16/bf16 input in f16/bf16, which is the parameter dtype's precision; with f32 parameters the moments
must be f32), and ρ(M) = LAMBDA·sqrt(M) the growth of a length-M sum's
error (the probabilistic bound of Higham & Mary, 2019; worst-case M·u is far too loose to see bugs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cases import Case, CaseInputs
from ..ops import get_op
from ..ops.layouts import REPLICATED
from ..numerics.dtypes import ROUNDS_XHAT, TINY, UNIT_ROUNDOFF, may_round_across, quantise
from .expected import Grouped, as_output, directional_outputs, effective_affine, grouped
from .running_error import exact, tracked_arithmetic


@dataclass(frozen=True)
class Constants:
    """Calibrated in docs/tolerance.md; change them only together with that calibration."""

    growth: float = 2.0       # LAMBDA in ρ(M) = LAMBDA·sqrt(M)
    rounding: float = 3.0     # output and element-wise rounding: a few operations, each ≤ u_o
    baseline_factor: float = 4.0  # K_BASELINE: never demand more than this × the baseline's accuracy
    second_order: float = 16.0  # K₂: multiplies the running-error bound of the second-order outputs


CONSTANTS = Constants()


def rank_masks(case: Case, view) -> list[np.ndarray]:
    """Per rank of a split case, 1 where it holds an element and 0 elsewhere, in the grouped view (the split axis
    may be any of its dims: the rows for SyncBN, the hidden dim for a hidden-parallel norm)."""
    masks = []
    for rank in range(len(case.split)):
        m = np.zeros(case.shape)
        m[case.record.layout.data_index(case.split, rank)] = 1.0
        masks.append(view.group(m))
    return masks


def element_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS) -> dict[str, np.ndarray]:
    """B_e for every output the op defines, each shaped like the reference output."""
    op = case.record
    if op.prologue is not None:
        return prologue_bounds(case, inputs, c)
    if op.modulation is not None:
        return modulation_bounds(case, inputs, c)
    view = case.view
    axes = view.axes
    ua = UNIT_ROUNDOFF[case.dtypes.accumulation]  # (all three no finer than the precision the kernel computes in)
    uo = case.dtypes.unit(case.dtype)
    up = case.dtypes.unit(case.param_dtype)
    uy = case.dtypes.unit(op.output_dtype(case, "y"))  # y's own storage: the input's, or promoted with the weight's
    us = max(ua, up)
    eps, mom = case.eps_value, case.momentum
    size = view.set_size

    def mean(a):
        return a.mean(axis=axes, keepdims=True)

    def rho(n):
        return c.growth * np.sqrt(max(n, 1))

    x = view.group(inputs.x)
    dy = view.group(inputs.dy)
    gamma, beta = effective_affine(case, inputs)

    # Forward statistics and how wrong an accumulation in u_a may leave them. An uncentred op
    # (RMSNorm) is the same formula with μ = 0 held exactly: σ² is then the mean of squares.
    if case.training:
        mu = mean(x) if op.centred else np.zeros_like(mean(x))
        dev = x - mu
        var = mean(dev * dev)
        # The probabilistic ρ(M) assumes independent rounding errors. Summing M identical values makes
        # them correlated, so a constant set gets the deterministic worst case, M·u (Higham, Thm 4.2).
        constant = x.max(axis=axes, keepdims=True) == x.min(axis=axes, keepdims=True)
        mean_growth = np.where(constant, float(size), rho(size))
        d_mu = (ua * mean_growth * mean(np.abs(x)) + c.rounding * us * np.abs(mu)) if op.centred else np.zeros_like(mu)
        if case.split is not None and op.layout.splits_sets:  # the ranks' means, each rounded (to the moments'
            # dtype), merged by their counts: c·u_s·Σ_r n_r/M·|μ_r| = c·u_s·Σ_r |Σ_{set ∩ r} x| / M
            d_mu = d_mu + c.rounding * us * sum(np.abs((x * m).sum(axis=axes, keepdims=True)) / max(size, 1)
                                                 for m in rank_masks(case, view))
        # Two-pass and Welford variances both lose about u_a·ρ(M) of σ², and Welford's running mean adds
        # a term in |μ|·mean|x − μ|; E[x²] − E[x]² would lose u_a·μ², which is what we must not allow.
        # Σ(x − μ̃)² = Σ(x − μ)² + M·δμ², and the variance may be held in the moments' dtype. SyncBN's
        # primitives pass invstd = 1/sqrt(σ² + eps) between ranks and recover σ² from it: u_a·(σ² + eps).
        d_var = (ua * mean_growth * (var + np.abs(mu) * mean(np.abs(dev))) + d_mu * d_mu + c.rounding * us * var
                 + c.rounding * ua * eps)
    else:  # eval mode: the running statistics, exact inputs that a kernel may convert to its own precision
        mu, var = (np.broadcast_to(view.per_channel_values(r), mean(x).shape)  # one per set, like the batch's
                   for r in (inputs.running_mean, inputs.running_var))
        dev = x - mu
        d_mu, d_var = c.rounding * us * np.abs(mu), c.rounding * us * (var + eps)
    r = 1.0 / np.sqrt(var + eps)
    xhat = dev * r
    rel_r = 0.5 * d_var / (var + eps) + c.rounding * us
    d_xhat = r * d_mu + np.abs(xhat) * rel_r
    if not case.training:  # kernels fold it into y = x·(γr) + (β − μγr): x·s and μ·s rounded separately
        d_xhat = d_xhat + c.rounding * ua * r * (np.abs(x) + np.abs(mu))

    # A casting chain that rounds x̂ to the input dtype before the weight (RMSNorm's before-weight) may round an
    # x̂ known to within δx̂ to the other neighbour: one input-dtype ulp of it, times |γ| in y and |dy| in dγ
    # (y's own rounding covers it unless y is promoted to a finer dtype). One that rounds rstd first (rstd-input)
    # may flip rstd itself, which moves the whole row's x · rstd by |x| · ulp(rstd) before that rounding.
    flips = 0.0
    if case.casting == "rstd-input":
        r_flip = np.abs(dev) * may_round_across(r, r * rel_r, case.dtype)
        flips = r_flip + may_round_across(dev * quantise(r, case.dtype), d_xhat + r_flip, case.dtype)
    elif case.casting == "before-weight":
        flips = may_round_across(xhat, d_xhat, case.dtype)
    bound_y = c.rounding * uy * (np.abs(gamma * xhat) + np.abs(beta)) + np.abs(gamma) * (d_xhat + flips)
    d_dy = np.zeros_like(dy)  # error in the dy that enters the BatchNorm backward (a fused epilogue's)
    if op.epilogue is not None:
        # z = f(y): z inherits y's error through f'(y); the backward's dy = dz·f'(y) is recomputed
        # from an inexact y (f'') and rounded to the input dtype.
        ep = op.epilogue
        y_norm = gamma * xhat + beta
        grad1 = ep.grad(y_norm)
        dy = dy * grad1
        d_dy = np.abs(view.group(inputs.dy) * ep.grad2(y_norm)) * bound_y + c.rounding * uo * np.abs(dy)
        # f is several element-wise operations of its own (SiLU: exp, add, divide, multiply): twice the rounding.
        # Where f'(y) = 0 (SiLU's minimum) y's error reaches z at second order: ½|f''|·δy² (f'' varies slowly).
        bound_y = (np.abs(grad1) * bound_y + 0.5 * np.abs(ep.grad2(y_norm)) * bound_y * bound_y
                   + 2 * c.rounding * uy * np.abs(ep.f(y_norm)))

    # Backward: dx = r·(g − ḡ − x̂·h).
    # (eval mode: dx = r·g, the statistics do not depend on x)
    g = gamma * dy
    d_g = np.abs(gamma) * d_dy
    if case.casting in ROUNDS_XHAT:  # the gradient reaching x̂ is rounded to x̂'s dtype, the input's, on its way
        d_g = d_g + uo * np.abs(g)
    batch_terms = case.training
    gbar = mean(g) if op.centred and batch_terms else np.zeros_like(mu)  # no mean subtracted, no ḡ term in dx
    h = mean(g * xhat) if batch_terms else np.zeros_like(mu)
    def sum_growth(terms):  # ρ(M) of a set's sum; M·u where its terms are all equal (correlated errors)
        return np.where(terms.max(axis=axes, keepdims=True) == terms.min(axis=axes, keepdims=True), float(size),
                        rho(size))

    d_gbar = ua * sum_growth(g) * mean(np.abs(g)) + mean(d_g) if op.centred and batch_terms else np.zeros_like(mu)
    d_h = (ua * sum_growth(g * xhat) * mean(np.abs(g * xhat)) + mean(np.abs(g) * d_xhat) + mean(d_g * np.abs(xhat))
           if batch_terms else np.zeros_like(mu))
    dx = r * (g - gbar - xhat * h)

    bounds = {
        "y": bound_y,
        "dx": c.rounding * uo * r * (np.abs(g) + np.abs(gbar) + np.abs(xhat * h))
        + r * (d_g + d_gbar + np.abs(xhat) * d_h + np.abs(h) * d_xhat)
        + np.abs(dx) * rel_r,
    }
    bounds = {k: view.ungroup(np.broadcast_to(v, x.shape)) for k, v in bounds.items()}

    per_channel = view.channel_count
    dweight = view.channel_sum(dy * xhat)
    dbias = view.channel_sum(dy)
    def param_growth(terms):  # ρ(M) of a parameter's sum; M·u where its terms are all equal (an expanded dy)
        equal = (terms.max(axis=(0, 3)) == terms.min(axis=(0, 3))).reshape(view.param_shape)
        return np.where(equal, float(per_channel), rho(per_channel))

    bounds["dweight"] = (
        ua * param_growth(dy * xhat) * view.channel_sum(np.abs(dy * xhat))
        + view.channel_sum(np.abs(dy) * (d_xhat + flips) + d_dy * np.abs(xhat))
        + c.rounding * up * np.abs(dweight)
    )
    bounds["dbias"] = (ua * param_growth(dy) * view.channel_sum(np.abs(dy)) + view.channel_sum(d_dy)
                       + c.rounding * up * np.abs(dbias))
    if case.split is not None and op.layout.params == REPLICATED:
        # Each rank rounds its local dγ/dβ to the parameter dtype before they are summed, and local
        # sums can be much larger than their total: c·u_p·Σ_r |local_r| on top.
        for name, per_element in (("dweight", dy * xhat), ("dbias", dy)):
            local = [np.abs(view.channel_sum(per_element * m)) for m in rank_masks(case, view)]
            bounds[name] = bounds[name] + c.rounding * up * np.sum(local, axis=0)

    # Saved statistics are returned in the accumulation precision, one per set.
    bounds["mean"] = (d_mu + c.rounding * us * np.abs(mu)).reshape(view.stats_shape)
    bounds["invstd"] = bounds["rstd"] = (r * rel_r).reshape(view.stats_shape)

    if op.running_stats and not case.training:  # eval mode leaves them exactly as they were
        bounds["running_mean"], bounds["running_var"] = np.zeros(case.channels), np.zeros(case.channels)
    elif op.running_stats:
        unbiased = size / max(size - 1, 1)
        rm, rv = inputs.running_mean, inputs.running_var
        # One statistic per channel (BatchNorm) or the batch average of the per-instance ones (InstanceNorm)
        mu_c, var_c = mu.mean(axis=0).reshape(-1), var.mean(axis=0).reshape(-1)
        bounds["running_mean"] = mom * d_mu.mean(axis=0).reshape(-1) + c.rounding * up * (
            np.abs((1 - mom) * rm) + np.abs(mom * mu_c)
        )
        bounds["running_var"] = mom * unbiased * d_var.mean(axis=0).reshape(-1) + c.rounding * up * (
            np.abs((1 - mom) * rv) + np.abs(mom * unbiased * var_c)
        )
    if case.order != 1:
        bounds.update(directional_bounds(case, inputs, c))
    for extension in op.extensions:  # (results a case field adds, bounded from the outputs': fp8's y_fp8, amax)
        if extension.applies(case) and extension.bounds is not None:
            bounds.update(extension.bounds(case, inputs, bounds, c))
    return bounds


def _inner_case(case: Case, inner) -> Case:
    """The case as the inner norm of a fused op sees it: the fused op's own fields (residual_dtype) left out."""
    return case.with_(op=inner.name, **{f: None for f in case.record.case_fields if f not in inner.case_fields})


def prologue_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS) -> dict[str, np.ndarray]:
    """A fused prologue's op (reference.Prologue: add + norm): the inner norm's bounds on the prologue's output h
    as the reference forms it, plus the prologue's own rounding: h stored in its dtype, and each summand's
    gradient, h's cotangent plus the norm's gradient of h, added and rounded to the summand's dtype. A fused
    kernel may normalise the sum before it rounds it for storage (in registers), or take its statistics from one
    and normalise the other (vLLM's): the inner norm's outputs on the unrounded sum differ from those on h by what
    that rounding moved, and twice that is allowed on top (a near-constant row of h has σ² = 0, its sum not)."""
    op = case.record
    prologue, inner = op.prologue, get_op(op.inner)
    ref = op.reference(inputs)
    h = ref[prologue.output]
    inner_case = _inner_case(case, inner)
    on_h = replace(inputs, case=inner_case, x=h, extra={})
    bounds = element_bounds(inner_case, on_h, c)
    unrounded = sum(inputs.x if s == "x" else inputs.extra[s] for s in prologue.summands)
    read_h = inner.reference(on_h)
    moved = {k: np.abs(a - read_h[k]) for k, a in inner.reference(replace(on_h, x=unrounded)).items()}
    bounds = {k: b + 2 * moved[k] if k in moved and moved[k].shape == b.shape else b for k, b in bounds.items()}
    bounds[prologue.output] = c.rounding * case.dtypes.unit(op.output_dtype(case, prologue.output)) * np.abs(h)
    cotangent = inputs.extra.get(prologue.cotangent, 0.0)  # (none where the case's form does not return the output)
    terms = np.abs(cotangent) + np.abs(ref["dx"] - cotangent)  # |dh| + |the norm's gradient of h|
    norm_bound = bounds["dx"]
    for gradient, wrt in op.gradients.items():
        if wrt in prologue.summands:
            bounds[gradient] = norm_bound + c.rounding * case.dtypes.unit(op.output_dtype(case, gradient)) * terms
    return bounds


def modulation_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS) -> dict[str, np.ndarray]:
    """A modulated norm (reference.Modulation: y = ŷ·m + shift, m = 1 + scale per sample): the inner norm's bounds
    with dŷ = dy·m as its dy, rounded to the input dtype as an eager kernel stores it (twice what that rounding and
    m's own moved the inner gradients is allowed on top, as for a prologue); y inherits ŷ's error times |m| plus
    its own rounding (m, the product, the sum); dscale = Σ_S dy·ŷ and dshift = Σ_S dy are sums over a sample's
    sequence S of products rounded in the storage dtype."""
    op = case.record
    mod, inner = op.modulation, get_op(op.inner)
    ndim = inputs.x.ndim
    scale, shift = (mod.broadcast(inputs.extra[name], ndim) for name in (mod.scale, mod.shift))
    m = 1 + scale
    uo, ua = case.dtypes.unit(case.dtype), UNIT_ROUNDOFF[case.dtypes.accumulation]
    uy = case.dtypes.unit(op.output_dtype(case, "y"))

    inner_case = _inner_case(case, inner)
    on_inner = replace(inputs, case=inner_case, dy=quantise(inputs.dy * quantise(m, case.dtype), case.dtype), extra={})
    bounds = element_bounds(inner_case, on_inner, c)
    rounded, exact = inner.reference(on_inner), inner.reference(replace(on_inner, dy=inputs.dy * m))
    for name in inner.gradients:
        if name in bounds and name in exact:
            bounds[name] = bounds[name] + 2 * np.abs(exact[name] - rounded[name])

    y_norm = exact["y"]  # ŷ
    bound_norm = bounds["y"]
    y = y_norm * m + shift
    bounds["y"] = (np.abs(m) * bound_norm + c.rounding * uy * (np.abs(y_norm * m) + np.abs(y))
                   + uo * (1 + np.abs(scale)) * np.abs(y_norm))  # (1 + scale itself rounded)

    per_sample = inputs.extra[mod.scale].ndim
    terms = inputs.x.size // max(inputs.extra[mod.scale].size, 1)  # each sample's sequence

    def over_sequence(a):  # (each sample's sum over its sequence: the modulation's geometry)
        return mod.sequence_sum(a, per_sample)

    growth = c.growth * np.sqrt(terms) if terms > 1 else 0.0
    products = np.abs(inputs.dy * y_norm)
    bounds[mod.dscale] = (over_sequence(np.abs(inputs.dy) * bound_norm + (c.rounding * uo + growth * ua) * products)
                          + c.rounding * uo * np.abs(over_sequence(inputs.dy * y_norm)))
    bounds[mod.dshift] = (growth * ua * over_sequence(np.abs(inputs.dy))
                          + c.rounding * uo * np.abs(over_sequence(inputs.dy)))
    return bounds


def directional_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS) -> dict[str, np.ndarray]:
    """K₂ × the running-error bound (engine.running_error) of the directional-derivative formulas (reference.setwise:
    order 2's outputs and forward mode's JVPs alike),
    every element-wise step rounded in the storage dtype and every sum accumulated at u_a. Not derived by hand
    like the first-order bounds above; calibrated (docs/tolerance.md)."""
    view = case.view
    uo, ua = case.dtypes.unit(case.dtype), UNIT_ROUNDOFF[case.dtypes.accumulation]
    g = grouped(case, inputs)

    def known(a):
        return exact(a, uo)

    tracked = Grouped(known(g.x), known(g.dy), known(g.gamma), known(g.beta),
                      None if g.running is None else tuple(map(known, g.running)),
                      known(g.ddx), known(g.ddweight), known(g.ddbias))
    ar = tracked_arithmetic(view.axes, view.channel_sum, view.set_size, view.channel_count, ua, c.growth)
    out = directional_outputs(case, tracked, ar)
    return {name: c.second_order * as_output(case, name, t.bound) for name, t in out.items()}


def budget_ratio(
    got: np.ndarray, ref: np.ndarray, bound: np.ndarray, baseline: np.ndarray | None, dtype: str,
    c: Constants = CONSTANTS,
) -> np.ndarray:
    """|got − ref| / allowed per element; non-finite mismatches are +inf, matching non-finites 0.

    A reference value beyond the range of `dtype` rounds to ±inf there, so ±inf is then right.
    """
    with np.errstate(over="ignore"):
        overflowed = np.isinf(quantise(ref, dtype)) & np.isfinite(ref)
    ref = np.where(overflowed & (got == np.copysign(np.inf, ref)), got, ref)
    err = _abs_error(got, ref)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return err / (allowance(ref, bound, baseline, c) + TINY[dtype])


def allowance(ref: np.ndarray, bound: np.ndarray, baseline: np.ndarray | None, c: Constants = CONSTANTS) -> np.ndarray:
    """allowed_e = max(B_e, K·|baseline_e − ref_e|): the error each element may have."""
    if baseline is None:
        return bound
    base_err = _abs_error(baseline, ref)
    # A baseline that itself went non-finite earns no allowance.
    return np.maximum(bound, np.where(np.isfinite(base_err), c.baseline_factor * base_err, 0.0))


def slack(ref: np.ndarray, allowed: np.ndarray) -> float:
    """The largest error the budget lets through, relative to the tensor's own size (its RMS): at 1 or
    more an error as large as the tensor itself passes, so a pass there proves little about it."""
    finite = np.isfinite(ref)
    if not finite.any():
        return 0.0
    size = float(np.sqrt(np.mean(np.square(ref[finite]))))
    return float(np.max(allowed[finite])) / size if size > 0 else 0.0


def _abs_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    both_nonfinite_equal = ~np.isfinite(ref) & (got == ref) | (np.isnan(got) & np.isnan(ref))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - ref)
    err = np.where(both_nonfinite_equal, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)

