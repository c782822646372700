"""Residual add + LayerNorm: h = x + residual (in the residual stream's dtype), y = LayerNorm(h); returns (y, h)."""
from __future__ import annotations


from . import layernorm
from .core import Impl
from .layernorm import normalized_shape
from .residual import STREAM_RETURNED, add_norm

SIGNATURE = ("fn(input, residual, normalized_shape, weight, bias, eps) -> (y, h)  (h = input + residual in the "
             "residual dtype, y = layer_norm(h) in input's dtype)")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["residual"], normalized_shape(case), t.weight, t.bias, case.eps)


def add_layer_norm(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The eager composite: the add in the residual's dtype, F.layer_norm of the sum, y back in input's dtype."""
    import torch
    import torch.nn.functional as F
    h = input.to(residual.dtype) + residual
    # (F.layer_norm refuses a float32 input with half parameters: they join the stream's dtype, as a layer's would)
    weight, bias = (None if p is None else p.to(torch.promote_types(p.dtype, h.dtype)) for p in (weight, bias))
    return F.layer_norm(h, normalized_shape, weight, bias, eps).to(input.dtype), h


OP = add_norm(layernorm.OP, "add_layernorm", "residual add + LayerNorm: h = x + residual, y = LayerNorm(h); returns "
              "y and h", SIGNATURE, call, impls=(
                  Impl("torch", "add_layernorm", "x + residual, then torch.nn.functional.layer_norm, through autograd",
                       add_layer_norm, known_issues=layernorm.TORCH_ISSUES,
                       follows={**layernorm.TORCHS, **STREAM_RETURNED}),
              ))
