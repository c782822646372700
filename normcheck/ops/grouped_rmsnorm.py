"""Grouped RMSNorm: y = x · rsqrt(mean_g(x²) + eps) · (w + offset), the normalised row cut into groups of G
consecutive values (flattened over its K dims), each group with its own rstd and one weight over the whole row.
Mamba2's RMSNormGated(group_size=G) without its gate, and the inner norm of the gated records (ops.gated_rmsnorm).
Without a group size the row is one group: RMSNorm.

The groups are what such kernels dispatch on (a program per group, a group that is not a power of two, groups of
one value); statistics of the whole row, groups taken strided across the row and a weight indexed by the position in
the group are the bug classes this makes visible.
"""
from __future__ import annotations

import inspect
from dataclasses import replace
from math import prod

import numpy as np

from .. import reference
from ..core.errors import UsageError, Unsupported
from ..numerics.sets import SetView
from ..reference._moments import working
from . import rmsnorm
from .batchnorm import drop_none
from .core import CaseField, Impl, Op
from .design import Exclusion, Factor, levels
from .layernorm import ROWS, HIDDEN, channels_first, normalized_axes, normalized_shape, rows_shape

GROUP_SIZE = CaseField(
    "group_size", None, "statistics per group of G consecutive values of the normalised row (flattened), one weight "
    "over the row (Mamba2's RMSNormGated group_size; default: the whole row is one group)", parse=int, metavar="G",
    label="group={}", convention=False, defaulted=False,
    # (any divisor of the last dim divides the row; None: one group)
    draw=lambda shape, op: (None, *(g for g in range(1, shape[-1]) if shape[-1] % g == 0)))


def row_size(case) -> int:
    return prod(normalized_shape(case))


def group_count(case) -> int:
    return 1 if case.group_size is None else row_size(case) // case.group_size


def view(case) -> SetView:
    whole = rmsnorm.view(case)
    if case.group_size is None:
        return whole
    rows, g = case.shape[:len(case.shape) - case.normalized_dims], group_count(case)
    return SetView(case.shape, (prod(rows), g, case.group_size, 1), False, whole.param_shape, rows + (g,))


def validate(case) -> None:
    rmsnorm.validate(case)
    size = case.group_size
    if size is None:
        return
    if channels_first(case):
        raise UsageError(f"{case.op} groups the values of the trailing dims: --group-size takes --normalized-at "
                         "trailing")
    if size < 1 or row_size(case) % size:
        raise UsageError(f"--group-size {size} must divide the normalised row's {row_size(case)} values")


def group_keywords(fn, case) -> dict:
    """group_size=G where the case has groups; an implementation without that argument declines those cases."""
    if case.group_size is None:
        return {}
    try:
        takes = any(p.name == "group_size" or p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # (a builtin without a signature: let the call say)
        takes = True
    if not takes:
        raise Unsupported(f"{getattr(fn, '__name__', 'the implementation')} takes no group_size argument: the cases "
                          "with statistics per group are not judged")
    return {"group_size": case.group_size}


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, case.eps, **group_keywords(fn, case))


ARRAY_SIGNATURE = ("fn(x, weight, *, axes, eps[, group_size]) -> y  (rmsnorm's; group_size=G given where the case "
                   "has groups)")


def array_call(fn, a, case):
    return fn(a.x, a.weight, axes=normalized_axes(case), eps=case.eps_value, **group_keywords(fn, case))


def reference_outputs(i) -> dict[str, np.ndarray]:
    """RMSNorm's reference on each group as a row of its own, the weight applied over the whole row after it."""
    c = i.case
    if c.group_size is None:
        return rmsnorm.reference_outputs(i)
    rows, g, size = c.shape[:len(c.shape) - c.normalized_dims], group_count(c), c.group_size
    x, dy = i.x.reshape(rows + (g, size)), i.dy.reshape(rows + (g, size))
    convention = rmsnorm.convention_of(c)
    scale = None if i.weight is None else np.asarray(i.weight, working()).reshape(g, size) + c.weight_offset
    kw = dict(eps=convention["eps"], rounding=convention["rounding"])
    fwd = reference.rms_norm_forward(x, (size,), None, **kw)  # y: x̂ as the weight sees it
    dx = reference.rms_norm_backward(dy if scale is None else dy * scale, x, (size,), None, **kw).dx
    dweight = None if scale is None else (dy * fwd.y).reshape(-1, g * size).sum(axis=0).reshape(i.weight.shape)
    return drop_none(y=(fwd.y if scale is None else fwd.y * scale).reshape(c.shape), rstd=fwd.rstd.reshape(rows + (g,)),
                     dx=dx.reshape(c.shape), dweight=dweight)


def upcast(*tensors):
    """The tensors in float32 at least (float64 stays), as Mamba2's reference norm computes."""
    import torch
    return tuple(None if t is None else t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors)


def grouped_rms_norm(input, normalized_shape, weight=None, eps=None, group_size=None):
    """Mamba2's reference grouped norm: F.rms_norm over each group in float32 at least, times the weight, y back in
    input's dtype."""
    x, w = upcast(input, weight)
    if group_size is not None:
        k = len(normalized_shape)
        grouped = x.flatten(x.dim() - k).unflatten(-1, (-1, group_size))
        x = rmsnorm.rms_norm(grouped, (group_size,), None, eps).flatten(-2).unflatten(-1, tuple(normalized_shape))
        return (x if w is None else x * w).to(input.dtype)
    return rmsnorm.rms_norm(x, normalized_shape, w, eps).to(input.dtype)


def _group_level(count: int) -> str:
    """The level a case's group count reads as (a count no level makes, from --group-size, reads as the last)."""
    return {1: "row", 2: "two"}.get(count, "odd")


GROUP_SIZES = {"row": lambda h: None, "two": lambda h: h // 2 if h % 2 == 0 else None,
               "odd": lambda h: next((h // p for p in range(3, h + 1, 2) if h % p == 0), None)}


def grouped_shape(v: dict) -> dict:
    return {**rows_shape(v), "group_size": GROUP_SIZES[v["groups"]](v["hidden"])}


# RMSNorm's sweep with the group count a factor; rows and hidden size read as the row's, not the group's
GROUPS = Factor("groups", levels(
    "row", "one group: the whole row (RMSNorm)",
    "two", "two groups: each half of an even row (a power-of-two group where the row is one)",
    "odd", "an odd prime count of groups (its smallest): groups no power-of-two tile fits; one value each in a "
           "prime row",
), read=lambda c: _group_level(group_count(c)), field="group_size")
SWEEP = replace(
    rmsnorm.SWEEP,
    factors=(replace(ROWS, read=lambda c: prod(c.shape) // row_size(c)), replace(HIDDEN, read=row_size),
             *(f for f in rmsnorm.SWEEP.factors if f.name not in ("rows", "hidden")), GROUPS),
    shape=grouped_shape,
    exclusions=rmsnorm.SWEEP.exclusions + (
        Exclusion(("groups", "hidden"), lambda g, h: g == "row" or GROUP_SIZES[g](h) is not None,
                  "an odd row has no two halves, a power-of-two row no odd group count"),
        Exclusion(("groups", "normalized_dims"), lambda g, k: g == "row" or k == 1,
                  "groups over one normalised dim, as Mamba2 cuts its hidden dim"),
    ),
)

OP: Op = replace(
    rmsnorm.OP, name="grouped_rmsnorm",
    description="grouped RMSNorm: x · rsqrt(mean(x²) + eps) per group of G consecutive values of the row, "
                "· (w + offset) over the row",
    signature="fn(input, normalized_shape, weight, eps[, group_size]) -> Tensor  (rmsnorm's; group_size=G given "
              "where the case has groups; eps may be None)",
    call=call, reference=reference_outputs, view=view, validate=validate, sweep=SWEEP,
    fields=(*rmsnorm.OP.fields_without_extensions(), GROUP_SIZE), extensions=(),
    array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(Impl("torch", "grouped_rmsnorm", "torch.nn.functional.rms_norm over each group in float32 at least, times "
                "the weight, through autograd", grouped_rms_norm, follows=rmsnorm.TORCHS,
                known_issues=(rmsnorm.BATCH_VARIANCE,)),),
)
