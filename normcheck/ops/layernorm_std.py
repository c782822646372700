"""The annotated transformer's LayerNorm ("The Annotated Transformer", Harvard NLP, and the model repos that copied
it): y = a_2·(x − mean)/(std + eps) + b_2 per row over the last K dims, with std = x.std(-1, keepdim=True), torch's
unbiased standard deviation (Σd²/(H − 1) under the root), and eps added to it outside the root (default 1e-6).

It is LayerNorm's math with another statistic form (numerics.statistics), `("unbiased", "outside")`: s = Σd²/(H − 1)
and r = 1/(√s + eps). Its reference, first order and directional derivatives (the double backward, forward mode),
its bound, baseline and data profiles all follow from that form: dx = r·(g − ḡ − λ·x̂·h) with h = Σ(g·x̂)/(H − 1)
and λ = 1 + eps/√s. A row of one value has no unbiased std (torch's is NaN): its sets have 2 values at least.
"""
from __future__ import annotations

from dataclasses import replace

from ..numerics.sets import SetView
from ..numerics.statistics import StatisticForm
from ..reference.setwise import reference
from . import layernorm
from .batchnorm import drop_none
from .core import Impl, KnownIssue, Op, Signature
from .design import Design, eps_factor
from .layernorm import DIMS, HIDDEN, NORMALIZED_DIMS_FIELD, ROWS, normalized_shape, rows_shape

FORM = StatisticForm("unbiased", "outside")
SIGNATURE = ("fn(input, normalized_shape, weight, bias, eps) -> Tensor  (weight·(x − mean)/(x.std() + eps) + bias "
             "over the last K dims: std unbiased, eps outside the root)")
OUTPUTS = ("y", "dx", "dweight", "dbias")

# LayerNorm's rows, hidden sizes (2 values at least) and exclusions; eps from the layer's default 1e-6
SWEEP = Design(factors=(ROWS, HIDDEN.without(1), DIMS, eps_factor(1e-6, 0.0, 1e-10, 1e-2)), shape=rows_shape,
               exclusions=layernorm.SWEEP.exclusions)


def view(case) -> SetView:
    """LayerNorm's rows, their statistic x.std()'s: unbiased, eps outside its root."""
    return replace(layernorm.view(case), form=FORM)


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, t.bias, case.eps)


def reference_outputs(i) -> dict:
    """The form's reference (reference.setwise.reference)."""
    out = reference(i.case.view, i.x, i.dy, i.weight, i.bias, i.case.eps_value)
    return drop_none(**{name: out[name] for name in OUTPUTS})


def layer_norm_std(input, normalized_shape, weight=None, bias=None, eps=1e-6):
    """The annotated transformer's forward as it writes it, a_2 * (x - mean) / (std + eps) + b_2, over the last K
    dims, in float32 at least (float64 stays; y back in input's dtype, as autocast runs a layer norm)."""
    import torch
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    mean = x.mean(dims, keepdim=True)
    std = x.std(dims, keepdim=True)
    y = x - mean if weight is None else weight.to(x.dtype) * (x - mean)
    y = y / (std + eps)
    return (y if bias is None else y + bias.to(x.dtype)).to(input.dtype)


_MODULE = []


def annotated_module():
    """The tutorial's class, as it is written there (defined on first use: the ops layer imports torch inside the
    functions that run it)."""
    if not _MODULE:
        import torch
        import torch.nn as nn

        class LayerNorm(nn.Module):
            "Construct a layernorm module (See citation for details)."

            def __init__(self, features, eps=1e-6):
                super(LayerNorm, self).__init__()
                self.a_2 = nn.Parameter(torch.ones(features))
                self.b_2 = nn.Parameter(torch.zeros(features))
                self.eps = eps

            def forward(self, x):
                mean = x.mean(-1, keepdim=True)
                std = x.std(-1, keepdim=True)
                return self.a_2 * (x - mean) / (std + self.eps) + self.b_2
        _MODULE.append(LayerNorm)
    return _MODULE[0]


def annotated_layer(input, normalized_shape, weight=None, bias=None, eps=1e-6):
    """The tutorial's module over the last dim, its a_2 and b_2 the case's weight and bias (ones and zeros where the
    case has none), called in float32 at least (torch.func.functional_call; y back in input's dtype)."""
    import torch
    from torch.func import functional_call
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    features = normalized_shape[-1]
    layer = annotated_module()(features, eps)
    params = {"a_2": torch.ones(features, dtype=x.dtype) if weight is None else weight.to(x.dtype),
              "b_2": torch.zeros(features, dtype=x.dtype) if bias is None else bias.to(x.dtype)}
    return functional_call(layer, params, (x,)).to(input.dtype)


# Found by its default sweep: a row of equal values (near_constant's even rows; two values that round equal)
ZERO_STD_DOUBLE_BACKWARD = KnownIssue(
    "torch-std-zero-double-backward",
    "torch's std backward (grad/(2·std), masked to 0 where std = 0) has a NaN derivative where std = 0, so the double "
    "backward and forward mode of x.std() are NaN in every row of equal values (d2x, d2weight and d2dy alike); there "
    "std + eps has a kink (the second derivative's one-sided limits differ) and the reference takes their mean, "
    "finite (1x4095 f16 near_constant: d2x NaN for 0)",
    lambda c: c.order != 1,
    Signature(tensors=("d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight"), nonfinite=True),
    code=("aten.std", "aten.std_mean"),
)


def one_dim(case) -> str | None:
    return None if case.normalized_dims == 1 else "the tutorial's module normalises the last dim only"


OP = Op(
    name="layernorm_std",
    description="The annotated transformer's LayerNorm: a_2·(x − mean)/(std + eps) + b_2 per row over the last K dims, "
                "std unbiased (x.std()), eps outside the root",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=OUTPUTS, sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD,), set_dim=-1, validate=layernorm.validate, channels=False,
    min_set_size=2,
    impls=(
        Impl("torch", "layernorm_std", "a_2 * (x - mean) / (x.std() + eps) + b_2 in torch ops (float32 at least), "
             "through autograd", layer_norm_std, known_issues=(ZERO_STD_DOUBLE_BACKWARD,)),
        Impl("torch-module", "layernorm_std", "the annotated transformer's LayerNorm class, its a_2 and b_2 the "
             "case's (float32 at least), through autograd", annotated_layer, supports=one_dim,
             known_issues=(ZERO_STD_DOUBLE_BACKWARD,)),
    ),
)
