"""SimpleNorm (timm's `timm.layers.norm.SimpleNorm`, `fast_norm.simple_norm`): y = x · rsqrt(var(x) + eps) · w per row
over the last K dims, var torch.var's default, unbiased (Σ(x − μ)²/(H − 1)); x itself is not centred, and there is no
bias (x / std(x), as timm describes it).

It is RMSNorm's math with another statistic form (numerics.statistics), `("unbiased", "added", about_mean=True)`:
s = Σd²/(H − 1) of the deviations d = x − μ, r = 1/√(s + eps), while the output scales x, not d. Its reference, first
order and directional derivatives (the double backward, forward mode), its bound, baseline and data profiles all
follow from that form: dx = r·(g − d·r·h) with h = Σ(g·x·r)/(H − 1) (s moves with d, y with x). A row of one value has
no unbiased variance (torch's is NaN): its sets have 2 values at least.
"""
from __future__ import annotations

from dataclasses import replace

from ..numerics.sets import SetView
from ..numerics.statistics import StatisticForm
from ..reference.setwise import reference
from . import layernorm
from .batchnorm import drop_none
from .core import Impl, Op
from .design import Design, eps_factor
from .layernorm import DIMS, HIDDEN, NORMALIZED_DIMS_FIELD, ROWS, normalized_shape, rows_shape
from .layernorm import validate as validate_dims

FORM = StatisticForm("unbiased", "added", about_mean=True)
SIGNATURE = ("fn(input, normalized_shape, weight, eps) -> Tensor  (input · rsqrt(var(input) + eps) · weight over the "
             "last K dims: var unbiased, about the mean; input itself not centred)")
OUTPUTS = ("y", "dx", "dweight")

# LayerNorm's rows, hidden sizes (2 values at least: an unbiased variance) and exclusions (eps = 0 where a row's few
# values may round equal); eps from the layer's default 1e-6
SWEEP = Design(factors=(ROWS, HIDDEN.without(1), DIMS, eps_factor(1e-6, 0.0, 1e-10, 1e-2)), shape=rows_shape,
               exclusions=layernorm.SWEEP.exclusions)


def view(case) -> SetView:
    """LayerNorm's rows and per-element weight, their statistic torch.var's: unbiased, about the row's mean."""
    return replace(layernorm.view(case), form=FORM)


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, case.eps)


def reference_outputs(i) -> dict:
    """The form's reference (reference.setwise.reference), the output uncentred."""
    out = reference(i.case.view, i.x, i.dy, i.weight, None, i.case.eps_value, centred=False)
    return drop_none(**{name: out[name] for name in OUTPUTS})


def simple_norm(input, normalized_shape, weight=None, eps=1e-6):
    """x * rsqrt(var(x) + eps) * weight over the last K dims, as timm writes it, in float32 at least (float64 stays;
    y back in input's dtype, as autocast runs a norm), through autograd."""
    import torch
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    y = x * torch.rsqrt(torch.var(x, dim=dims, keepdim=True) + eps)
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


OP = Op(
    name="simplenorm",
    description="SimpleNorm (timm): x / std(x) · w, x · rsqrt(var(x) + eps) · w per row over the last K dims, var "
                "unbiased about the mean, x not centred",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=OUTPUTS, sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD,), set_dim=-1, validate=validate_dims, params=("weight",), centred=False,
    min_set_size=2, channels=False,
    impls=(Impl("torch", "simplenorm", "x * rsqrt(torch.var(x) + eps) * w in torch ops (float32 at least), through "
                "autograd", simple_norm),),
)
