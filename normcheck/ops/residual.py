"""Residual add + norm records, built from the inner norm's record: its sets, sweep, conventions and eps, with
the residual stream declared as the fused op's own interface (normcheck.reference.stages has the math: a Sum before the norm).

    fn(input, residual, normalized_shape, weight[, bias], eps) -> (y, h)    h = input + residual, y = norm(h)

or, in the form that returns y alone (case field returns="y", as the last norm of a network or a kernel's
`prenorm=False` mode in flash-attention's fused add + norm), `-> y`: then there is no h to differentiate and dx =
dresidual is the norm's gradient alone.

Its array contract is the inner norm's with the residual after x and h returned after y (y alone under
returns="y"): `fn(x, residual, weight[, bias], *, axes, eps) -> (y, h)`.

The residual stream has a dtype of its own (case field residual_dtype): "input" (x's, as a plain `h = x + residual`
in eager code gives) or "f32" (float32 for half input, as models that keep the residual stream in float32 pass it;
x's own for f32 and f64 input). It is a property of the tensors the caller passes, so it is a sweep factor, not a
convention: a fused kernel receives the residual as a tensor and must handle the dtype it is given (h and dresidual
come back in it).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..numerics.dtypes import UNIT_ROUNDOFF
from ..reference.stages import Sum
from .core import AMONG_CHOICES, CaseField, Extension, Impl, Op, Operand, Result
from .design import Exclusion, Factor, levels
from .fused import fused

RESIDUAL_DTYPES = ("input", "f32")
RETURNS = ("y,h", "y")
STREAM_RETURNED = {"returns": "y,h"}  # torch's composites return the stream: a convention they follow
RESIDUAL_DTYPE = CaseField("residual_dtype", "input", "the residual stream's dtype the caller passes: input (x's) or "
                           "f32 (float32 for half input); the sweep covers both", choices=RESIDUAL_DTYPES,
                           label="residual={}", quiet="input", convention=False, draw=AMONG_CHOICES)
# The stream's dtype as a factor of the sweep: what a mixed stream adds is where a kernel can round, store or
# differentiate in the wrong dtype (the sum rounded to x's dtype before its statistics, h stored in x's dtype, the
# residual cast down before the add, dresidual rounded to x's dtype, the backward recomputing from a rounded h)
STREAM_FACTOR = Factor("residual_dtype", levels(
    "input", "the stream in x's dtype, as eager `x + residual` keeps it",
    "f32", "a float32 stream under half x: the add, the stored h and dresidual in float32",
), read=lambda c: c.residual_dtype, fields=lambda v: {"residual_dtype": v})
# x + residual of a row of one or two values can cancel to exactly 0 (heavy-tailed data in half precision): with
# eps = 0 even RMSNorm then divides by zero
SUM_MAY_CANCEL = Exclusion(("eps", "hidden"), lambda eps, h: eps != 0 or h > 2,
                           "eps = 0 with rows of 1 or 2 values: x + residual can cancel to a zero row")
STREAM_NEEDS_HALF = Exclusion(("residual_dtype", "dtype"), lambda stream, dtype: stream == "input" or dtype[0] in ("f16", "bf16"),
                              "a float32 stream under f32 or f64 x is x's own dtype")
RETURNS_FIELD = CaseField("returns", "y,h", "what the implementation returns: y,h (the norm's output and the new "
                          "residual stream, the default) or y (the norm's output alone)", choices=RETURNS,
                          label="returns={}", quiet="y,h", meanings={"y,h": "returns y and the residual stream h",
                                                                     "y": "returns y alone"}, draw=AMONG_CHOICES)
WHY_ONCE = ("the double backward and forward mode of a residual add + norm are not judged yet: the directional-derivative formulas "
            "(reference.setwise) are a norm's of its own inputs, not of a prologue's")


def residual_dtype(case) -> str:
    """The residual stream's dtype in `case`: x's, or float32 where that is wider than x's."""
    if case.residual_dtype == "f32" and UNIT_ROUNDOFF[case.dtype] > UNIT_ROUNDOFF["f32"]:
        return "f32"
    return case.dtype


OPERANDS = (Operand("residual", dtype=residual_dtype, gradient="dresidual"),)
# The residual stream returned, and its cotangent taken, unless the case's implementation returns y alone
STREAM = Extension("returns", values=("y,h",), operands=(Operand("dh", role="cotangent", dtype=residual_dtype, of="h"),),
                   results=(Result("h", dtype=residual_dtype, cotangent="dh"),))


def array_contract(inner: Op) -> "tuple[str | None, Callable | None]":
    """(array_signature, array_call) of add + `inner`: `inner`'s, with each declared data input after x (the residual)
    and (y, *results) returned; (None, None) when `inner` has none."""
    if inner.array_signature is None:
        return None, None
    operands = [o.name for o in OPERANDS if o.role == "input"]
    returns = f"({', '.join(('y',) + tuple(r.name for r in STREAM.results))}), or y alone with returns=y"
    signature = inner.array_signature.replace("fn(x, ", f"fn(x, {', '.join(operands)}, ", 1).replace(
        ") -> y", f") -> {returns}", 1)

    def array_call(fn, a, case):
        def with_operands(x, *rest, **keywords):  # (inner's call passes x first: the operands follow it)
            return fn(x, *(a.extra[name] for name in operands), *rest, **keywords)
        return inner.array_call(with_operands, a, case)

    return signature, array_call


# h = x + residual, stored in the stream's dtype and returned (with dh taken) where the case's form returns it
RESIDUAL_ADD = Sum(("x", "residual"), "h", "dh", ("dx", "dresidual"))


def add_norm(inner: Op, name: str, description: str, signature: str, call, impls: tuple[Impl, ...]) -> Op:
    """The add + `inner` record: `inner`'s geometry and conventions, plus the residual stream."""
    array_signature, array_call = array_contract(inner)
    return fused(
        inner, (RESIDUAL_ADD,), name=name, description=description, signature=signature, call=call,
        outputs=inner.outputs + ("h", "dresidual"), required=inner.required + ("dresidual",),
        fields=(*inner.fields_without_extensions(), RESIDUAL_DTYPE, RETURNS_FIELD), extensions=(STREAM,),
        impls=impls, operands=OPERANDS,
        sweep=replace(inner.sweep, factors=inner.sweep.factors + (STREAM_FACTOR,),
                      exclusions=inner.sweep.exclusions + (STREAM_NEEDS_HALF, SUM_MAY_CANCEL)),
        double_backward=False, why_once_differentiable=WHY_ONCE, array_signature=array_signature,
        array_call=array_call,
    )
