"""RMSNorm with eps outside the root: y = x / (√mean(x²) + eps) · w per row over the last K dims, as several model
repos write it (x / (x.norm(2, dim=-1, keepdim=True) · H^(−1/2) + eps) · w) where F.rms_norm adds eps to the mean of
squares.

It is RMSNorm's math with another statistic form (numerics.statistics), `("mean", "outside")`: r = 1/(√s + eps) of
s = mean(x²). Its reference, first order and directional derivatives (the double backward, forward mode), its bound,
baseline and data profiles all follow from that form: dx = r·(g − λ·x̂·mean(g·x̂)) with λ = 1 + eps/√s. A zero row is
scaled by 1/eps (y = 0, dx = g/eps: the norm's derivative, masked there, takes no part).
"""
from __future__ import annotations

from dataclasses import replace

from ..numerics.sets import SetView
from ..numerics.statistics import StatisticForm
from ..reference.setwise import reference
from . import rmsnorm
from .batchnorm import drop_none
from .core import Impl, KnownIssue, Op, Signature
from .design import Design, eps_factor
from .layernorm import DIMS, HIDDEN, NORMALIZED_DIMS_FIELD, ROW_EXCLUSIONS, ROWS, normalized_shape, rows_shape
from .layernorm import validate as validate_dims

FORM = StatisticForm("mean", "outside")
SIGNATURE = ("fn(input, normalized_shape, weight, eps) -> Tensor  (input / (√mean(input²) + eps) · weight over the "
             "last K dims: eps outside the root)")
OUTPUTS = ("y", "dx", "dweight")

# RMSNorm's rows, hidden sizes and exclusions; eps from the layers' common 1e-6
SWEEP = Design(factors=(ROWS, HIDDEN, DIMS, eps_factor(1e-6, 0.0, 1e-10, 1e-2)), shape=rows_shape,
               exclusions=ROW_EXCLUSIONS)


def view(case) -> SetView:
    """RMSNorm's rows, eps outside the root of their mean of squares."""
    return replace(rmsnorm.view(case), form=FORM)


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, case.eps)


def reference_outputs(i) -> dict:
    """The form's reference (reference.setwise.reference), uncentred."""
    out = reference(i.case.view, i.x, i.dy, i.weight, None, i.case.eps_value, centred=False)
    return drop_none(**{name: out[name] for name in OUTPUTS})


def rms_norm_eps_out(input, normalized_shape, weight=None, eps=1e-6):
    """x / (x.norm(2) · H^(−1/2) + eps) · weight over the last K dims (flattened), in float32 at least (float64
    stays; y back in input's dtype), through autograd: as the model repos write it."""
    import torch
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    rows = x.flatten(x.dim() - len(normalized_shape))
    rms = rows.norm(2, dim=-1, keepdim=True) * rows.shape[-1] ** -0.5
    y = (rows / (rms + eps)).reshape(x.shape)
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


# Found by its default sweep: a zero row (near_constant's even rows; exact's small integers can all be 0), eps > 0
ZERO_ROW_DOUBLE_BACKWARD = KnownIssue(
    "torch-vector-norm-zero-row-double-backward-eps-out",
    "torch's linalg.vector_norm backward (dy·x/‖x‖, masked where ‖x‖ = 0) has a NaN derivative at a zero row, so the "
    "double backward and forward-over-reverse of x / (x.norm() · H^(−1/2) + eps) are NaN in every zero row; there "
    "the norm has a kink (the second derivative's one-sided limits differ) and the reference takes their mean, finite",
    lambda c: c.order != 1,
    Signature(tensors=("d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight"), nonfinite=True),
    code=("aten.linalg_vector_norm",),
)

OP = Op(
    name="rmsnorm_eps_out",
    description="RMSNorm with eps outside the root: x / (√mean(x²) + eps) · w per row over the last K dims",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=OUTPUTS, sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD,), set_dim=-1, validate=validate_dims, params=("weight",), centred=False,
    min_set_size=1, channels=False,
    impls=(Impl("torch", "rmsnorm_eps_out", "x / (x.norm(2) · H^(−1/2) + eps) · w in torch ops (float32 at least), "
                "through autograd", rms_norm_eps_out, known_issues=(ZERO_ROW_DOUBLE_BACKWARD,)),),
)
