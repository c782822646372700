"""LayerNorm with a SiLU output gate, as linear-attention blocks write their output norm (a "swish gate": flash-linear-
attention's FusedLayerNormSwishGate): y = (LayerNorm(x)·w + b)·silu(z), the gate z one value per element of x.

The LayerNorm record with one Scale stage after it (reference.stages): LayerNorm's rows, hidden sizes, eps and
conventions; the gate's gradient dgate = dy·ŷ·silu'(z) is shaped like x (ŷ: the affine norm's output). The bias inside the gate (the norm's
β is gated too), the gate's derivative taken as σ(z) and the norm's gradient taken from the ungated dy are the bug
classes this makes visible.
"""
from __future__ import annotations

from ..reference.stages import AFTER, SILU, Scale
from . import layernorm
from .core import Impl, Operand
from .fused import fused
from .gated_rmsnorm import gate_values
from .layernorm import normalized_axes, normalized_shape

FORMULA = "(LayerNorm(x) · w + b) · silu(z)"
WHY_ONCE = ("the double backward and forward mode of a gated LayerNorm are not judged yet: the directional-derivative "
            "formulas (reference.setwise) are a norm's of its own inputs, not of a gate's")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["gate"], normalized_shape(case), t.weight, t.bias, case.eps)


ARRAY_SIGNATURE = "fn(x, gate, weight, bias, *, axes, eps) -> y  (LayerNorm's, with the gate after x: shaped like x)"


def array_call(fn, a, case):
    return fn(a.x, a.extra["gate"], a.weight, a.bias, axes=normalized_axes(case), eps=case.eps)


def layer_norm_gate(input, gate, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The eager composite: F.layer_norm, then · silu(gate)."""
    import torch.nn.functional as F
    return F.layer_norm(input, normalized_shape, weight, bias, eps) * F.silu(gate)


OP = fused(
    layernorm.OP, (Scale("gate", SILU, ("dgate",), side=AFTER),), name="layernorm_gate",
    description=f"gated LayerNorm: {FORMULA}, the gate z per element",
    signature=f"fn(input, gate, normalized_shape, weight, bias, eps) -> Tensor  ({FORMULA}; gate shaped like input)",
    call=call, outputs=("y", "dx", "dgate", "dweight", "dbias"), required=("y", "dx", "dgate", "dweight", "dbias"),
    saved_stats=(), operands=(Operand("gate", draw=gate_values, gradient="dgate"),),
    fields=layernorm.OP.fields_without_extensions(), extensions=(), double_backward=False,
    why_once_differentiable=WHY_ONCE, array_signature=ARRAY_SIGNATURE, array_call=array_call,
    layer_switches=(("norm_before_gate", True),),  # (Mamba2's gated LayerNorm, given by class)
    impls=(Impl("torch", "layernorm_gate", f"{FORMULA} with torch.nn.functional.layer_norm and silu, through "
                "autograd", layer_norm_gate, known_issues=layernorm.TORCH_ISSUES, follows=layernorm.TORCHS),),
)
