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
from ..numerics.dtypes import TINY, UNIT_ROUNDOFF, quantise
from .error_terms import (Precisions, SetSums, batch_statistics, casting_flips, epilogue_errors, independent_errors_sum,
                          input_gradient_error, normalised, output_error, parameter_gradient_errors, read_either,
                          replicated_rounding_errors, running_statistics, running_update_errors,
                          saved_statistics_errors)
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


def element_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS,
                   unrounded: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """B_e for every output the op defines, each shaped like the reference output: the error terms of one
    normalisation (engine.error_terms) composed, a fused op's stages around them. `unrounded`: x before a fused
    prologue rounded it (add + norm's unrounded sum), which a kernel may read in its place."""
    op = case.record
    if op.prologue is not None:
        return prologue_bounds(case, inputs, c)
    if op.modulation is not None:
        return modulation_bounds(case, inputs, c)
    view = case.view
    u, sums, rounding = Precisions.of(case), SetSums(view, c.growth), c.rounding
    x, dy = view.group(inputs.x), view.group(inputs.dy)
    gamma, beta = effective_affine(case, inputs)

    def statistics(values):
        return (batch_statistics(case, values, sums, u, rounding) if case.training
                else running_statistics(case, inputs, values, sums, u, rounding))

    stats = statistics(x)
    norm = normalised(case, x, stats, u, rounding)
    if unrounded is not None:
        values = view.group(unrounded)
        norm = read_either(norm, normalised(case, values, statistics(values), u, rounding))
    flips = casting_flips(case, norm)
    y_error = output_error(gamma, beta, norm, flips, u, rounding)
    dy_error = np.zeros_like(dy)  # the error of the dy the norm's backward receives (a fused epilogue's)
    if op.epilogue is not None:
        after = epilogue_errors(op.epilogue, gamma * norm.xhat + beta, y_error, dy, u, rounding)
        y_error, dy, dy_error = after.output_error, after.dy, after.dy_error

    bounds = {"y": y_error, "dx": input_gradient_error(case, sums, norm, gamma, dy, dy_error, u, rounding)}
    bounds = {k: view.ungroup(np.broadcast_to(v, x.shape)) for k, v in bounds.items()}
    bounds.update(parameter_gradient_errors(sums, norm, flips, dy, dy_error, u, rounding))
    if case.split is not None and op.layout.params == REPLICATED:
        extra = replicated_rounding_errors(case, sums, norm, dy, u, rounding)
        bounds.update({name: bounds[name] + e for name, e in extra.items()})
    bounds.update(saved_statistics_errors(stats, norm, u, rounding, view.stats_shape))
    if op.running_stats:
        bounds.update(running_update_errors(case, inputs, sums, stats, u, rounding))
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
    unrounded = sum(inputs.x if s == "x" else inputs.extra[s] for s in prologue.summands)
    bounds = element_bounds(inner_case, on_h, c, unrounded=unrounded)
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
    # each term dy·ŷ carries ŷ's error and its own rounding (one, in the storage dtype), independent from one token's
    # row to the next
    term_errors = np.abs(inputs.dy) * bound_norm + uo * products
    bounds[mod.dscale] = (independent_errors_sum(term_errors, over_sequence, terms, c.growth)
                          + growth * ua * over_sequence(products) + c.rounding * uo * np.abs(over_sequence(inputs.dy * y_norm)))
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

