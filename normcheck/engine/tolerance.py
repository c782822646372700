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

from dataclasses import dataclass

import numpy as np

from ..cases import Case, CaseInputs
from ..ops.core import DIRECTIONAL
from ..ops.layouts import REPLICATED
from ..numerics.dtypes import FINITE_MAX, FP8_FORMATS, TINY, UNIT_ROUNDOFF, quantise
from .error_terms import (Precisions, SetSums, batch_statistics, casting_flips, inexact_input, input_gradient_error,
                          kink_spread, normalised, output_error, parameter_gradient_errors, read_either,
                          replicated_rounding_errors, running_statistics, running_update_errors,
                          saved_statistics_errors)
from .expected import Grouped, as_output, directional_outputs, effective_affine, grouped
from .running_error import exact, tracked_arithmetic
from .stage_bounds import fused_bounds


@dataclass(frozen=True)
class Constants:
    """Calibrated in docs/tolerance.md; change them only together with that calibration."""

    growth: float = 2.0       # LAMBDA in ρ(M) = LAMBDA·sqrt(M)
    rounding: float = 3.0     # output and element-wise rounding: a few operations, each ≤ u_o
    baseline_factor: float = 4.0  # K_BASELINE: never demand more than this × the baseline's accuracy
    second_order: float = 16.0  # K₂: multiplies the running-error bound of the second-order outputs


CONSTANTS = Constants()


def element_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS, *, unrounded: np.ndarray | None = None,
                   input_error: np.ndarray | None = None, dy_error: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """B_e for every output the op defines, each shaped like the reference output: the error terms of one
    normalisation (engine.error_terms) composed; a fused op's stages around them (engine.stage_bounds). What a stage
    around the norm hands it, each x-shaped: `unrounded`, x before a stored sum rounded it, which a kernel may read
    in its place; `input_error`, how far from x the value a kernel normalises may be; `dy_error`, the error of the
    dy its backward receives."""
    op = case.record
    if op.stages_of(case):
        return fused_bounds(case, inputs, c, element_bounds)
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
    if input_error is not None:
        norm = inexact_input(case, norm, view.group(input_error), sums)
    flips = casting_flips(case, norm)
    y_error = output_error(gamma, beta, norm, flips, u, rounding)
    dy_error = np.zeros_like(dy) if dy_error is None else view.group(dy_error)

    bounds = {"y": y_error, "dx": input_gradient_error(case, sums, norm, gamma, dy, dy_error, u, rounding)}
    bounds = {k: view.ungroup(np.broadcast_to(v, x.shape)) for k, v in bounds.items()}
    bounds.update(parameter_gradient_errors(sums, norm, flips, dy, dy_error, u, rounding))
    if case.split is not None and op.layout.params == REPLICATED:
        extra = replicated_rounding_errors(case, sums, norm, dy, u, rounding)
        bounds.update({name: bounds[name] + e for name, e in extra.items()})
    bounds.update(saved_statistics_errors(stats, norm, u, rounding, view.stats_shape))
    if op.tracks(case):
        bounds.update(running_update_errors(case, inputs, sums, stats, u, rounding))
    if case.order != 1:
        bounds.update(directional_bounds(case, inputs, c, norm=norm, sums=sums, flips=flips))
    return bounds


def directional_bounds(case: Case, inputs: CaseInputs, c: Constants = CONSTANTS, *, norm=None,
                       sums=None, flips=0.0) -> dict[str, np.ndarray]:
    """K₂ × the running-error bound (engine.running_error) of the directional-derivative formulas (reference.setwise:
    order 2's outputs and forward mode's JVPs alike),
    every element-wise step rounded in the storage dtype and every sum accumulated at u_a. Not derived by hand
    like the first-order bounds above; calibrated (docs/tolerance.md). Given the first order's `norm` and `sums`,
    plus what a set whose λ·h jumps may move them by (error_terms.kink_spread; none in the other forms), and in
    y's JVP |γ̇|·`flips`: where a casting chain's rounding of x̂ may flip it (error_terms.casting_flips), the x̂
    that the weight's direction meets may be the other neighbour of the reference's, as y's own bound has it."""
    view = case.view
    uo, ua = case.dtypes.unit(case.dtype), UNIT_ROUNDOFF[case.dtypes.accumulation]
    g = grouped(case, inputs)
    spread = None if norm is None else kink_spread(case, sums, norm, g)

    def known(a):
        return exact(a, uo)

    tracked = Grouped(known(g.x), known(g.dy), known(g.gamma), known(g.beta),
                      None if g.running is None else tuple(map(known, g.running)),
                      known(g.ddx), known(g.ddweight), known(g.ddbias))
    ar = tracked_arithmetic(view, ua, c.growth)
    out = directional_outputs(case, tracked, ar, rounds=False)
    extra = dict(spread or {})
    if np.any(flips):
        extra["d2dy"] = extra.get("d2dy", 0.0) + np.abs(g.ddweight) * flips
    return {name: c.second_order * as_output(case, name, t.bound)
            + (as_output(case, name, extra[DIRECTIONAL[name]]) if DIRECTIONAL[name] in extra else 0.0)
            for name, t in out.items()}


def budget_ratio(
    got: np.ndarray, ref: np.ndarray, bound: np.ndarray, baseline: np.ndarray | None, dtype: str,
    c: Constants = CONSTANTS,
) -> np.ndarray:
    """|got − ref| / allowed per element; non-finite mismatches are +inf, matching non-finites 0 (whatever their
    allowance: a singular set's reference and bound are NaN alike).

    A reference value beyond the range of `dtype` rounds to ±inf there, so ±inf is then right; so it is where the
    reference lies within its final rounding's reach of that range (Yardstick.overflowed).
    """
    return Yardstick.of(ref, bound, baseline, dtype, c).ratios(got)


@dataclass(frozen=True)
class Yardstick:
    """What judging an output needs of its case alone, computed once however many implementations are judged on
    it: the reference, each element's allowance plus the dtype's tiny (the ratio's denominator), where ±inf of the
    reference's sign is a right answer (`overflowed`, None: nowhere; _overflowed says where) and the budget's
    slack."""

    ref: np.ndarray
    denominator: np.ndarray
    overflowed: np.ndarray | None
    slack: float

    @classmethod
    def of(cls, ref: np.ndarray, bound: np.ndarray, baseline: np.ndarray | None, dtype: str,
           c: Constants = CONSTANTS) -> "Yardstick":
        allowed = allowance(ref, bound, baseline, c)
        return cls(ref, allowed + TINY[dtype], _overflowed(ref, allowed, dtype, c), slack(ref, allowed))

    def ratios(self, got: np.ndarray) -> np.ndarray:
        """|got − ref| / allowed per element (budget_ratio)."""
        ref = self.ref
        if self.overflowed is not None:  # (±inf where the reference overflows the dtype is the right answer)
            ref = np.where(self.overflowed & (got == np.copysign(np.inf, ref)), got, ref)
        error = _abs_error(got, ref)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ratios = error / self.denominator
        # (an exact match is no error whatever its allowance: where the reference is NaN its bound is too, and 0/NaN
        # is NaN, counted as inf: eps = 0 on a set of one value, 0/0 in the reference and in any correct layer)
        return ratios if not np.isnan(np.sum(ratios)) else np.where(error == 0, 0.0, ratios)


def _overflowed(ref: np.ndarray, allowed: np.ndarray, dtype: str, c: Constants = CONSTANTS) -> np.ndarray | None:
    """Where ±inf of the reference's sign is a right answer in `dtype` (None: nowhere): where the finite reference
    rounds to ±inf there, and where it lies within its final rounding's reach of a value that does.

    The reach is the output rounding term of the allowance, c·u_o·|ref| (no more than the allowance): the few roundings
    in the output dtype on the way to the output. A kernel computing in a wider precision holds a value within its
    allowance of the reference and rounds it to `dtype` last; where the reference lies within that term of the
    overflow threshold (f16: 65520, halfway from 65504 to 2^16), such a value may lie beyond it and round to ±inf, as
    a correct one does (Llama's RMSNorm in f32, x̂ and its gradient rounded to f16 as the before-weight chain says: d2x
    65528.1 in f32 where the reference is 65512.1, stored as inf). Further from the threshold only a larger error
    reaches it, and the allowance is no licence for that: a first-order bound of rounding errors says nothing of an
    intermediate that overflows (torch's f16 BatchNorm backward: dγ inf for 919, whose allowance of 5e5 is the
    offset data's cancellation). fp8 outputs saturate by definition (their stage clamps before it rounds): only the
    reference's own rounding there."""
    u = 0.0 if dtype in FP8_FORMATS else c.rounding * UNIT_ROUNDOFF[dtype]
    with np.errstate(invalid="ignore"):
        # (|ref| + its reach is at most |ref|·(1 + u): NaN compares False; ±inf reaches it, excluded below)
        if not np.any(np.abs(ref) >= FINITE_MAX[dtype] / (1 + u)):
            return None
    with np.errstate(over="ignore", invalid="ignore"):
        reach = np.minimum(allowed, u * np.abs(ref))
        far = ref + np.copysign(np.where(np.isnan(reach), 0.0, reach), ref)
        overflowed = np.isinf(quantise(far, dtype)) & np.isfinite(ref)
    return overflowed if overflowed.any() else None


def allowance(ref: np.ndarray, bound: np.ndarray, baseline: np.ndarray | None, c: Constants = CONSTANTS) -> np.ndarray:
    """allowed_e = max(B_e, K·|baseline_e − ref_e|): the error each element may have."""
    if baseline is None or baseline is ref:  # (a baseline that is the reference itself adds nothing to B)
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
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - ref)
    if np.isfinite(np.sum(err)):  # (every error finite: no non-finite pair to forgive, no NaN to count as inf)
        return err
    both_nonfinite_equal = ~np.isfinite(ref) & (got == ref) | (np.isnan(got) & np.isnan(ref))
    err = np.where(both_nonfinite_equal, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)

