"""RMSNorm written with F.normalize: y = F.normalize(x, eps) · √H · w per row over the last K dims, as lucidrains' and
x-transformers' RMSNorm write it (often with F.normalize's own eps, 1e-12, and none of their own; (1 + w) with
weight_offset 1).

It is RMSNorm's math with another statistic form (numerics.statistics): x·√H/max(‖x‖, eps) = x/max(rms, eps/√H), the
mean of squares with its root floored at eps/√H, `("mean", "floored")` with eps_scale H^(−1/2). Its reference, first
order and directional derivatives, bound, baseline and data profiles follow from that form: a row whose norm is under
eps is scaled by √H/eps and its statistics take no part in the backward (λ = 0 there).
"""
from __future__ import annotations

from dataclasses import replace

from ..numerics.sets import SetView
from ..numerics.statistics import StatisticForm
from ..reference.setwise import reference
from . import rmsnorm, scalenorm
from .batchnorm import drop_none
from .core import Impl, Op
from .design import Design, Factor, levels
from .layernorm import DIMS, HIDDEN, NORMALIZED_DIMS_FIELD, ROW_EXCLUSIONS, ROWS, normalized_shape, rows_shape
from .layernorm import validate as validate_dims

SIGNATURE = ("fn(input, normalized_shape, weight, eps) -> Tensor  (F.normalize(input, eps) · √H · weight over the "
             "last K dims, H their size: the norm floored at eps)")
OUTPUTS = ("y", "dx", "dweight")

# RMSNorm's rows, hidden sizes and exclusions; eps at F.normalize's default, which the layers leave in place
EPS = Factor("eps", levels(1e-12, "F.normalize's default, which these layers keep (they take no eps)",
                           1e-8, "another floor written into F.normalize(x, eps=...)",
                           1e-2, "large: where the floor holds shows", 0.0, "eps = 0: no floor"),
             read=lambda c: c.eps, fields=lambda v: {"eps": v})
SWEEP = Design(factors=(ROWS, HIDDEN, DIMS, EPS), shape=rows_shape, exclusions=ROW_EXCLUSIONS)


def view(case) -> SetView:
    """RMSNorm's rows, the root of their mean of squares floored at eps/√H."""
    rows = rmsnorm.view(case)
    return replace(rows, form=StatisticForm("mean", "floored", eps_scale=rows.set_size ** -0.5))


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, case.eps)


def reference_outputs(i) -> dict:
    """The form's reference (reference.setwise.reference), uncentred."""
    c = i.case
    out = reference(c.view, i.x, i.dy, i.weight, None, c.eps_value, offset=c.weight_offset, centred=False)
    return drop_none(**{name: out[name] for name in OUTPUTS})


def rms_norm_l2(input, normalized_shape, weight=None, eps=1e-12):
    """F.normalize over the rows (flattened over their K dims) · √H · weight, in float32 at least (float64 stays; y
    back in input's dtype), through autograd: as the layers write it."""
    import torch
    import torch.nn.functional as F
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    rows = x.flatten(x.dim() - len(normalized_shape))
    y = (F.normalize(rows, dim=-1, eps=eps) * rows.shape[-1] ** 0.5).reshape(x.shape)
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


OP = Op(
    name="rmsnorm_l2",
    description="RMSNorm as F.normalize(x, eps) · √H · w per row over the last K dims: the norm floored at eps",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=OUTPUTS, sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD, rmsnorm.WEIGHT_OFFSET), set_dim=-1, validate=validate_dims, params=("weight",),
    centred=False, min_set_size=1, channels=False,
    impls=(Impl("torch", "rmsnorm_l2", "F.normalize(x, eps) · √H · w (float32 at least), through autograd",
                rms_norm_l2, follows={"weight_offset": 0.0},
                known_issues=(scalenorm.ZERO_ROW_DOUBLE_BACKWARD, scalenorm.STRIDED_F32_SUM)),),
)
