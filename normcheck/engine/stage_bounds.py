"""The tolerance of a fused op (ops.fused): its inner norm's bounds, composed with one bound per stage kind.

The stages are peeled from the outside in (the last after the norm first, then the first before it): each stage's
bound sees what it wraps (the inner norm, or the norm with the stages inside this one) as a `Wrapped`, its bounds
and its reference on given inputs, and adds what the stage itself may err (docs/tolerance.md, "Fused stages"):

    Sum, before        the norm bounded on the stored sum h, what reading the unrounded sum instead moves added
                       (error_terms.read_either); h's own rounding; each summand's gradient: the norm's + c·u·|terms|
    Scale, before      the norm bounded on v = u·f(m) as an input known to within its roundings (error_terms.
                       inexact_input); du = dv·f(m) and dm = Σ dv·u·f'(m) carry dv's bound and their own roundings
    Scale, after       the norm bounded with dŷ = dy·f(m) rounded as an eager kernel stores it (twice what that
                       rounding moved on top, and f(m)'s rounding bound where kernels round f differently); y
                       inherits ŷ's bound through |f(m)|; dm = Σ dy·ŷ·f'(m) and ds = Σ dy,
                       sums of products over the operand's broadcast dims, their errors independent term to term
    Activation, after  z = f(ŷ): ŷ's bound through f' (and f''), f's own roundings; the norm's backward receives
                       dz·f'(ŷ) with the error an inexact ŷ gives it (error_terms.epilogue_errors)
    Cast, after        q = round(sat(ŷ·s)), amax = max |ŷ|: ŷ's bound scaled, plus one ulp of q's format where the
                       interval holds a rounding midpoint; amax: how far ŷ's errors move its largest magnitude

Keyword bounds (`unrounded`, `dy_error`, `input_error`) pass through every stage to the inner norm's element_bounds:
the record validates that a Sum is the last stage before the norm (a stage after the norm that changes dy adds its
error to `dy_error`, which the stage inside it takes on: an activation after a modulation hands it dz·f'(v)'s).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..cases import Case, CaseInputs
from ..numerics.dtypes import TINY, UNIT_ROUNDOFF, quantise, saturate
from ..ops import get_op
from ..ops.fused import store_of
from ..reference.stages import AFTER, staged
from .error_terms import Precisions, epilogue_errors, independent_errors_sum
from .expected import expected_outputs


@dataclass(frozen=True)
class Wrapped:
    """What a stage wraps: `bounds(inputs, **keyword bounds)` and `reference(inputs)` of it on a case's inputs
    (x and dy as the stage hands them on), and the gradients it defines."""
    bounds: Callable[..., dict[str, np.ndarray]]
    reference: Callable[[CaseInputs], dict[str, np.ndarray]]
    gradients: tuple[str, ...]


def inner_case(case: Case, inner) -> Case:
    """The case as the inner norm of a fused op sees it: the fused op's own fields (residual_dtype) left out."""
    return case.with_(op=inner.name, **{f: None for f in case.record.case_fields if f not in inner.case_fields})


def inner_of(case: Case):
    """The norm a case's stages wrap, and the case as it sees it: a fused op's inner record without the fused op's
    own fields; a norm whose extensions add stages (fp8 output's cast), itself without those extensions' fields."""
    op = case.record
    if op.inner is None:
        return op, case.with_(**{e.field: None for e in op.extensions if e.stages})
    inner = get_op(op.inner)
    return inner, inner_case(case, inner)


def fused_bounds(case: Case, inputs: CaseInputs, c, element_bounds) -> dict[str, np.ndarray]:
    """B_e of every output of a case with stages (Op.stages_of; element_bounds: the inner norm's, engine.tolerance)."""
    inner, norm_case = inner_of(case)

    def on_norm(i: CaseInputs) -> CaseInputs:
        return replace(i, case=norm_case, extra={})

    def reference(i: CaseInputs) -> dict[str, np.ndarray]:  # (every gradient; eval mode's formulas there)
        return inner.reference(on_norm(i)) if norm_case.training else expected_outputs(norm_case, on_norm(i))

    wrapped = Wrapped(lambda i, **kw: element_bounds(norm_case, on_norm(i), c, **kw), reference, tuple(inner.gradients))
    return _wrap(case, case.record.stages_of(case), wrapped, inner.reference, c)(inputs)


def _wrap(case: Case, stages: tuple, norm: Wrapped, norm_reference, c) -> Callable:
    """The bounds of the norm with `stages` around it, as a function of the case's inputs."""
    if not stages:
        return norm.bounds
    outer = stages[-1] if stages[-1].side == AFTER else stages[0]
    rest = tuple(s for s in stages if s is not outer)
    inside = Wrapped(_wrap(case, rest, norm, norm_reference, c),
                     staged(norm_reference, rest, None, store_of) if rest else norm.reference,
                     norm.gradients + tuple(g for s in rest for g in s.gradients))
    bound = BOUNDS[outer.kind, outer.side]
    return lambda i, **kw: bound(outer, case, i, inside, c, **kw)


def _unit(case: Case, name: str) -> float:
    """The unit roundoff of an output's storage dtype."""
    return case.dtypes.unit(case.record.output_dtype(case, name))


def sum_before(stage, case: Case, inputs: CaseInputs, inside: Wrapped, c, **kw) -> dict[str, np.ndarray]:
    """A stored sum h = q(x + residual) normalised (add + norm): the norm's bounds on h as the reference forms it,
    plus the sum's own rounding: h stored in its dtype, and each summand's gradient, h's cotangent plus the norm's
    gradient of h, added and rounded to the summand's dtype. A fused kernel may normalise the sum before it rounds
    it for storage (in registers), or take its statistics from one and normalise the other: what reading the
    unrounded sum moves is an input error of the norm (read_either), and twice what it moves each output is
    allowed on top (a near-constant row of h has σ² = 0, its sum not)."""
    h, _ = stage.forward(inputs.x, inputs.extra, store_of(inputs))
    unrounded = sum(inputs.x if s == "x" else inputs.extra[s] for s in stage.summands)
    on_h = replace(inputs, x=h)
    bounds = inside.bounds(on_h, unrounded=unrounded, **kw)
    read_h = inside.reference(on_h)
    # (a sum stored in a precision that holds it exactly, f64's, is the unrounded sum: reading it moves nothing)
    read_unrounded = read_h if np.array_equal(h, unrounded) else inside.reference(replace(on_h, x=unrounded))
    moved = {k: np.abs(a - read_h[k]) for k, a in read_unrounded.items() if k in read_h}
    bounds = {k: b + 2 * moved[k] if k in moved and moved[k].shape == b.shape else b for k, b in bounds.items()}
    bounds[stage.output] = c.rounding * _unit(case, stage.output) * np.abs(h)
    cotangent = inputs.extra.get(stage.cotangent, 0.0)  # (none where the case's form does not return the output)
    terms = np.abs(cotangent) + np.abs(read_h["dx"])  # |dh| + |the norm's gradient of h|
    norm_bound = bounds["dx"]
    for gradient in stage.gradients:
        bounds[gradient] = norm_bound + c.rounding * _unit(case, gradient) * terms
    return bounds


def operand_gradient_error(terms, term_errors, reduce, count: int, u_acc: float, u_out: float, c) -> np.ndarray:
    """The error of an operand's gradient Σ terms over the dims it is broadcast over (`reduce`, `count` terms each):
    each term's own error (independent from term to term: error_terms.independent_errors_sum), the sum's growth at
    u_a and its storage rounding."""
    growth = c.growth * np.sqrt(count) if count > 1 else 0.0
    return (independent_errors_sum(term_errors, reduce, count, c.growth) + growth * u_acc * reduce(np.abs(terms))
            + c.rounding * u_out * np.abs(reduce(terms)))


class _Operand:
    """A Scale stage's operand laid over x: its value broadcast, its gradient's reduction and term count."""

    def __init__(self, stage, inputs: CaseInputs, name: str):
        self.value = inputs.extra[name]
        self.ndim = np.ndim(self.value)
        self.broadcast = stage.broadcast.expand(self.value, inputs.x.ndim)
        self.count = inputs.x.size // max(np.size(self.value), 1)
        self.reduce = lambda a: stage.broadcast.reduce(a, self.ndim)


def scale_after(stage, case: Case, inputs: CaseInputs, inside: Wrapped, c, **kw) -> dict[str, np.ndarray]:
    """y = ŷ·f(m) + s (adaLN's modulation, 1 + scale per sample; a gate after the norm, silu(z) per element): the
    norm's bounds with dŷ = dy·f(m) as its dy, rounded to the input dtype as an eager kernel stores it (twice what
    that rounding and f(m)'s own moved the norm's gradients is allowed on top, as for a stored sum; an f(m) that
    kernels round differently, SiLU's, known to within its rounding bound besides); y inherits ŷ's error times |f(m)|
    plus its own rounding (f(m), the product, the sum); dm = Σ dy·ŷ·f'(m) and ds = Σ dy are sums over the operand's
    broadcast dims of products rounded in the storage dtype."""
    m = _Operand(stage, inputs, stage.multiplier)
    factor = stage.fn.f(m.broadcast)
    uo, ua = case.dtypes.unit(case.dtype), UNIT_ROUNDOFF[case.dtypes.accumulation]
    on_norm = replace(inputs, dy=quantise(inputs.dy * quantise(factor, case.dtype), case.dtype))
    # f(m) of a function no two kernels round alike (SiLU: exp and a division, to within an ulp or so) is known to
    # within its rounding bound, element by element; one correctly rounded operation (1 + m) rounds alike everywhere
    factor_error = stage.fn.rounding(m.broadcast, uo, c.rounding)  # (f(m) evaluated in the storage dtype)
    own = 0.0 if stage.fn.correctly_rounded else factor_error
    received = np.broadcast_to(kw.pop("dy_error", 0.0), inputs.dy.shape)  # (the error of the dy a stage after it hands it)
    dy_error = np.abs(inputs.dy) * own + np.abs(factor) * received
    bounds = inside.bounds(on_norm, dy_error=dy_error, **kw)
    exact_dy = inputs.dy * factor
    rounded = inside.reference(on_norm)  # (a product the input dtype holds exactly, f64's, is the exact one)
    exact = rounded if np.array_equal(on_norm.dy, exact_dy) else inside.reference(replace(on_norm, dy=exact_dy))
    for name in inside.gradients:
        if name in bounds and name in exact:
            bounds[name] = bounds[name] + 2 * np.abs(exact[name] - rounded[name])

    y_norm, bound_norm = exact["y"], bounds["y"]  # ŷ and its bound
    y = y_norm * factor
    if stage.shift is not None:
        y = y + stage.broadcast.expand(inputs.extra[stage.shift], inputs.x.ndim)
    bounds["y"] = (np.abs(factor) * bound_norm + c.rounding * _unit(case, "y") * (np.abs(y_norm * factor) + np.abs(y))
                   + factor_error * np.abs(y_norm))

    slope = stage.fn.grad(m.broadcast)
    terms = inputs.dy * y_norm * slope
    # each term dy·ŷ·f'(m) carries ŷ's error, dy's, f'(m)'s own and its product's rounding (one, in the storage dtype)
    term_errors = (np.abs(inputs.dy * slope) * bound_norm + np.abs(y_norm * slope) * received
                   + np.abs(inputs.dy * y_norm) * stage.fn.grad_rounding(m.broadcast, uo, c.rounding) + uo * np.abs(terms))
    dm = stage.gradients[0]
    bounds[dm] = operand_gradient_error(terms, term_errors, m.reduce, m.count, ua, _unit(case, dm), c)
    if stage.shift is not None:
        s, ds = _Operand(stage, inputs, stage.shift), stage.gradients[1]
        bounds[ds] = operand_gradient_error(inputs.dy, received, s.reduce, s.count, ua, _unit(case, ds), c)
    return bounds


def scale_before(stage, case: Case, inputs: CaseInputs, inside: Wrapped, c, **kw) -> dict[str, np.ndarray]:
    """v = x·f(m) + s normalised (a gate on the norm's input, Mamba2's x·silu(z)): the norm bounded on v as an input
    known to within f's own rounding and the product's one rounding to the input dtype (a kernel may keep v in
    registers or store it: u_o·|v| covers either); the norm's gradient dv (bound B(dv)) reaches dx = dv·f(m) and
    dm = Σ dv·x·f'(m) with their own roundings; ds = Σ dv."""
    m = _Operand(stage, inputs, stage.multiplier)
    factor, slope = stage.fn.f(m.broadcast), stage.fn.grad(m.broadcast)
    uo, ua = case.dtypes.unit(case.dtype), UNIT_ROUNDOFF[case.dtypes.accumulation]
    v, _ = stage.forward(inputs.x, inputs.extra, store_of(inputs))
    # f(m)'s own rounding, and the product's one rounding to the input dtype where a kernel stores v (a subnormal v:
    # to within u·tiny)
    factor_error = stage.fn.rounding(m.broadcast, uo, c.rounding)
    v_error = factor_error * np.abs(inputs.x) + uo * (np.abs(v) + TINY[case.dtype])
    on_v = replace(inputs, x=v)
    bounds = inside.bounds(on_v, input_error=v_error, **kw)
    dv, dv_bound = inside.reference(on_v)["dx"], bounds["dx"]

    dx = dv * factor
    bounds["dx"] = (np.abs(factor) * dv_bound + np.abs(dv) * factor_error
                    + c.rounding * _unit(case, "dx") * np.abs(dx))
    terms = dv * inputs.x * slope
    term_errors = (np.abs(inputs.x * slope) * dv_bound + np.abs(dv * inputs.x) * stage.fn.grad_rounding(
        m.broadcast, uo, c.rounding) + uo * np.abs(terms))
    dm = stage.gradients[0]
    bounds[dm] = operand_gradient_error(terms, term_errors, m.reduce, m.count, ua, _unit(case, dm), c)
    if stage.shift is not None:
        s, ds = _Operand(stage, inputs, stage.shift), stage.gradients[1]
        bounds[ds] = operand_gradient_error(dv, dv_bound, s.reduce, s.count, ua, _unit(case, ds), c)
    return bounds


def activation_after(stage, case: Case, inputs: CaseInputs, inside: Wrapped, c, **kw) -> dict[str, np.ndarray]:
    """z = f(ŷ) (an activation fused after the norm): ŷ's bound, as the norm gives it, through f (epilogue_errors),
    and the norm's backward bounded again on dy = dz·f'(ŷ) with the error an inexact ŷ gives it."""
    y_norm = inside.reference(inputs)["y"]
    dz_error = kw.pop("dy_error", 0.0)  # (the error of the dz it receives, from a stage after it)
    after = epilogue_errors(stage.fn, y_norm, inside.bounds(inputs, **kw)["y"], inputs.dy, Precisions.of(case),
                            c.rounding)
    bounds = inside.bounds(replace(inputs, dy=after.dy), dy_error=after.dy_error + np.abs(stage.fn.grad(y_norm)) * dz_error,
                           **kw)
    bounds["y"] = after.output_error
    return bounds


def cast_after(stage, case: Case, inputs: CaseInputs, inside: Wrapped, c, **kw) -> dict[str, np.ndarray]:
    """q = round(sat(ŷ·s)) and amax = max |ŷ| beside ŷ (fp8 output): q gets ŷ's bound times the scale, plus what
    rounding makes of any value within that bound of ŷ·s (rounding_spread: one ulp of q's format where the interval
    holds a midpoint, 0 elsewhere; saturation is 1-Lipschitz, so the range's edge adds nothing); amax gets the
    largest error max |ŷ| can take from ŷ's element errors, max(B(ŷ) at the argmax, max(|ŷ| + B(ŷ)) − max |ŷ|),
    plus its own rounding to float32. Everything else is what it wraps (du = dv)."""
    bounds = inside.bounds(inputs, **kw)
    y = inside.reference(inputs)["y"]
    # ŷ's bound is relative to ŷ; a stored subnormal ŷ (f16: below 6.1e-5) rounds to its absolute spacing instead,
    # which ŷ's own comparison forgives (engine.tolerance: + tiny) and the scale magnifies
    y_dtype = case.record.output_dtype(case, "y")
    bound = bounds["y"] + c.rounding * case.dtypes.unit(y_dtype) * TINY[y_dtype]
    s = float(inputs.extra[stage.scale])
    error = s * bound
    bounds[stage.output] = error + rounding_spread(y * s, error, case.record.output_dtype(case, stage.output))
    magnitude = np.abs(y)
    if magnitude.size:
        top = int(np.argmax(magnitude))
        # max |ŷ| moves by at most B(ŷ) at its argmax downward, and by max(|ŷ| + B(ŷ)) − max |ŷ| upward
        moved = max(float(bound.flat[top]), float(np.max(magnitude + bound)) - float(magnitude.flat[top]))
        bounds[stage.amax] = np.asarray(moved + c.rounding * _unit(case, stage.amax) * float(magnitude.flat[top]))
    else:
        bounds[stage.amax] = np.asarray(0.0)
    return bounds


def rounding_spread(values: np.ndarray, error: np.ndarray, fmt: str) -> np.ndarray:
    """How far the stored (saturated, rounded) value of anything within `error` of `values` may lie from that of
    `values`: 0 where they all round alike, one ulp of the format where the interval holds a midpoint (at a power of
    two, the ulp of the binade the other value falls in). Saturation is 1-Lipschitz: the range's edge adds nothing."""
    stored = [quantise(saturate(v, fmt), fmt) for v in (values - error, values, values + error)]
    return np.maximum(np.abs(stored[0] - stored[1]), np.abs(stored[2] - stored[1]))


# One bound per stage kind and side (reference.stages)
BOUNDS = {("sum", "before"): sum_before, ("scale", "before"): scale_before, ("scale", "after"): scale_after,
          ("activation", "after"): activation_after, ("cast", "after"): cast_after}
