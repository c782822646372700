"""ScaleNorm (Nguyen & Salazar, 2019): y = (g + offset) · x / max(‖x‖, eps) per row over the last K dims, with one
scalar gain g for the whole layer; no mean, no bias.

It is RMSNorm's math with three differences a kernel can get wrong, all declared by its view: the statistic is the
row's total Σx², not its mean (x̂ has norm 1, not RMS 1), and eps floors the norm, as F.normalize and
norm.clamp(min=eps) do (a row whose norm is below eps is scaled by 1/eps, and its statistics then take no part in the
backward), or, as a convention an implementation declares (--eps-at sum), is added to Σx²: its statistic form
(`FORMS`, numerics.statistics); and the parameter is one scalar, whose gradient sums dy·x̂ over every element of the
batch (`param_axes`). Two more conventions of real code scale x̂ to RMS 1 (the mean of squares, not the total): mmpose's
x / max(‖x‖/√H, eps) · g floors the RMS at eps (--eps-at rms), and x-transformers' F.normalize(x) · √H · g floors the
norm at eps (--eps-at normalize: the RMS floored at eps/√H); its unit_offset is weight_offset 1.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..numerics.formats import base_format
from ..numerics.sets import SetView
from ..numerics.statistics import StatisticForm
from ..reference.setwise import reference as setwise_reference
from .batchnorm import drop_none
from .core import AMONG_CHOICES, CaseField, Impl, KnownIssue, Op, Signature
from .design import Design, Factor, eps_factor, levels
from .layernorm import DIMS, HIDDEN, NORMALIZED_DIMS_FIELD, ROW_EXCLUSIONS, ROWS, normalized_axes, normalized_shape
from .layernorm import rows_shape
from .layernorm import validate as validate_dims
from .layernorm import view as row_view
from .rmsnorm import WEIGHT_OFFSET

SIGNATURE = "fn(input, normalized_shape, weight, eps) -> Tensor  (weight: the scalar gain g, shape (1,); eps: a number)"
OUTPUTS = ("y", "dx", "dweight")

# RMSNorm's rows and hidden sizes; eps from 1e-5 (the usual floor) to one above a tiny row's norm, and the gain at
# the size the layer is initialised to (√H) besides 1.
SWEEP = Design(
    factors=(ROWS, HIDDEN, DIMS, eps_factor(1e-5, 0.0, 1e-10, 1e-2),
             Factor("gamma_scale", levels(1.0, "g of size 1", 30.0, "g ≈ √H, as the layer is initialised"),
                    read=lambda c: c.gamma_scale, fields=lambda v: {"gamma_scale": v})),
    shape=rows_shape, exclusions=ROW_EXCLUSIONS,
)


EPS_AT = CaseField("eps_at", "floor", "where eps enters: floor (the norm floored at eps, max(‖x‖, eps), as "
                   "F.normalize; the default), sum (added to the sum of squares, sqrt(Σx² + eps)), rms (the RMS "
                   "floored at eps, x / max(‖x‖/√H, eps), as mmpose) or normalize (F.normalize(x, eps)·√H, as "
                   "x-transformers)",
                   choices=("floor", "sum", "rms", "normalize"), metavar="WHERE", label="eps@{}", quiet="floor",
                   meanings={"floor": "floors the norm at eps, max(‖x‖, eps)",
                             "sum": "adds eps to the sum of squares, sqrt(Σx² + eps)",
                             "rms": "floors the RMS at eps, x / max(‖x‖/√H, eps)",
                             "normalize": "scales F.normalize(x, eps) by √H"}, draw=AMONG_CHOICES)


# Its statistic form by its eps_at convention: the row's total Σx², its root floored at eps (1/max(‖x‖, eps)) or eps
# added to it (1/√(Σx² + eps)); or the row's mean, its root floored at eps (the RMS floored) or at eps/√H (the norm
# floored, the result scaled by √H: normalize, whose eps_scale the view sets from H)
FORMS = {"floor": StatisticForm("total", "floored"), "sum": StatisticForm("total", "added"),
         "rms": StatisticForm("mean", "floored"), "normalize": StatisticForm("mean", "floored")}


def form_of(eps_at: str, set_size: int) -> StatisticForm:
    """The form of a row of `set_size` elements: F.normalize(x)·√H's floor on the norm is eps/√H on the RMS."""
    form = FORMS[eps_at]
    return replace(form, eps_scale=set_size ** -0.5) if eps_at == "normalize" else form


def view(case) -> SetView:
    """The rows' sets, whose statistic is a total (eps flooring its root, or added to it), and one gain over every
    element."""
    rows = row_view(case)
    return replace(rows, param_shape=(1,), param_axes=(), form=form_of(case.eps_at, rows.set_size))


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, case.eps)


ARRAY_SIGNATURE = "fn(x, weight, *, axes, eps) -> y  (weight: the scalar gain, shape (1,); axes: (-K, ..., -1))"


def array_call(fn, a, case):
    return fn(a.x, a.weight, axes=normalized_axes(case), eps=case.eps_value)


def reference_outputs(i) -> dict[str, np.ndarray]:
    """The form's reference (reference.setwise.reference), uncentred, over the view's one gain."""
    out = setwise_reference(i.case.view, i.x, i.dy, i.weight, None, i.case.eps_value, offset=i.case.weight_offset,
                            centred=False)
    return drop_none(**{name: out[name] for name in OUTPUTS})


def scale_norm(input, normalized_shape, weight=None, eps=1e-5):
    """F.normalize over the rows (flattened over their K dims) times g, in float32 at least (float64 stays), y back
    in input's dtype: ScaleNorm as the layers write it."""
    import torch
    import torch.nn.functional as F
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    y = F.normalize(x.flatten(x.dim() - len(normalized_shape)), dim=-1, eps=eps).reshape(x.shape)
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


# Found by its default sweep and its calibration: a zero row (near_constant's even sets; exact's small integers can
# all be 0), eps > 0
ZERO_ROW_DOUBLE_BACKWARD = KnownIssue(
    "torch-vector-norm-zero-row-double-backward",
    "torch's linalg.vector_norm backward (dy·x/‖x‖, masked where ‖x‖ = 0) has a NaN derivative at a zero row, so "
    "the double backward of F.normalize (and of x / vector_norm(x).clamp(min=eps)) is NaN in every zero row, where "
    "eps floors the norm and the exact value is finite (r·ġ)",
    lambda c: c.order in (2, "fwd-rev") and c.profile in ("near_constant", "exact") and c.eps_value > 0,
    Signature(tensors=("d2x", "d2weight", "jvp_dx", "jvp_dweight"), nonfinite=True),
    code=("aten.linalg_vector_norm",),
)

# Found by the covering sweep of issue 41 (a case the earlier arrays left out)
STRIDED_F32_SUM = KnownIssue(
    "torch-vector-norm-strided-f32-sum",
    "torch CPU linalg.vector_norm over several dims of a non-contiguous f32 input (channels_last_3d, strided, "
    "transposed) sums the squares less accurately than over a contiguous one: F.normalize's y and dx on |mean| >> std "
    "data are off by 4.7 and 2.4 budgets (1x7x5x29x113 D=3 f32 channels_last_3d, offset: y 0.011314751 for "
    "0.011314325), y by 11.8 at 1x3x32x64x64, and dweight (Σ dy·y) follows y; the same values contiguous are right",
    lambda c: c.dtype == "f32" and c.normalized_dims > 1 and base_format(c.x_format) not in ("contiguous", "sliced"),
    Signature(tensors=("y", "dx", "dweight")),
    code=("aten.linalg_vector_norm",),
)


OP = Op(
    name="scalenorm",
    description="ScaleNorm: (g + offset) · x / max(‖x‖, eps) per row over the last K dims, one scalar gain g",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=OUTPUTS, sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD, WEIGHT_OFFSET, EPS_AT), set_dim=-1, validate=validate_dims,
    params=("weight",), centred=False, min_set_size=1, channels=False,
    array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(Impl("torch", "scalenorm", "F.normalize(x, eps) · g (float32 at least), through autograd", scale_norm,
                follows={"weight_offset": 0.0, "eps_at": "floor"},
                known_issues=(ZERO_ROW_DOUBLE_BACKWARD, STRIDED_F32_SUM)),),
)
