"""Gated RMSNorm, as state-space and linear-attention blocks use it: RMSNorm and a SiLU gate z, one value per element
of x, on either side of the norm. Two records, each the RMSNorm record with one Scale stage (reference.stages):

    gate_rmsnorm    y = RMSNorm(x · silu(z)) · w     the gate before the norm (Mamba2's RMSNormGated, its default
                                                     norm_before_gate=False)
    rmsnorm_gate    y = RMSNorm(x) · w · silu(z)     the norm before the gate (norm_before_gate=True; fused
                                                     linear-attention kernels' gated output norm)

RMSNorm's rows, hidden sizes, eps and conventions (weight offset, casting chain); the gate's gradient dgate is
shaped like x. Applying the gate on the wrong side, the gate's derivative taken as σ(z), leaving the gate out of
dx and statistics of the ungated x are the bug classes this makes visible.
"""
from __future__ import annotations

import numpy as np

from ..reference.stages import AFTER, BEFORE, SILU, Scale
from . import rmsnorm
from .core import Impl, Op, Operand
from .fused import fused
from .layernorm import normalized_axes, normalized_shape

WHY_ONCE = ("the double backward and forward mode of a gated RMSNorm are not judged yet: the directional-derivative "
            "formulas (reference.setwise) are a norm's of its own inputs, not of a gate's")


def gate_values(rng, shape) -> np.ndarray:
    """The gate's pre-activations as a projection gives them: both signs, across SiLU's dip (its minimum at −1.28)
    and its linear part."""
    return rng.normal(0.0, 2.0, size=shape)


OPERANDS = (Operand("gate", draw=gate_values, gradient="dgate"),)


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["gate"], normalized_shape(case), t.weight, case.eps)


ARRAY_SIGNATURE = ("fn(x, gate, weight, *, axes, eps) -> y  (rmsnorm's, with the gate after x: shaped like x; eps: a "
                   "number)")


def array_call(fn, a, case):
    return fn(a.x, a.extra["gate"], a.weight, axes=normalized_axes(case), eps=case.eps_value)


def _upcast(*tensors):
    """The tensors in float32 at least (float64 stays), as Mamba2's reference gated norm computes."""
    import torch
    return tuple(None if t is None else t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors)


def gate_rms_norm(input, gate, normalized_shape, weight=None, eps=None):
    """The gate before the norm, as Mamba2's reference writes it: x · silu(z) and F.rms_norm of it in float32 at
    least, y back in input's dtype."""
    import torch.nn.functional as F
    x, z, w = _upcast(input, gate, weight)
    return rmsnorm.rms_norm(x * F.silu(z), normalized_shape, w, eps).to(input.dtype)


def rms_norm_gate(input, gate, normalized_shape, weight=None, eps=None):
    """The norm before the gate, as Mamba2's reference writes it: F.rms_norm(x) · silu(z) in float32 at least, y
    back in input's dtype."""
    import torch.nn.functional as F
    x, z, w = _upcast(input, gate, weight)
    return (rmsnorm.rms_norm(x, normalized_shape, w, eps) * F.silu(z)).to(input.dtype)


def gated(name: str, side: str, formula: str, composite) -> Op:
    """The RMSNorm record with a SiLU gate `side` of the norm."""
    return fused(
        rmsnorm.OP, (Scale("gate", SILU, ("dgate",), side=side),), name=name,
        description=f"gated RMSNorm: {formula}, the gate z per element",
        signature=f"fn(input, gate, normalized_shape, weight, eps) -> Tensor  ({formula}; gate shaped like input; "
                  "eps may be None)",
        call=call, outputs=("y", "rstd", "dx", "dgate", "dweight"), required=("y", "dx", "dgate", "dweight"),
        operands=OPERANDS, fields=rmsnorm.OP.fields_without_extensions(), extensions=(), double_backward=False,
        why_once_differentiable=WHY_ONCE, array_signature=ARRAY_SIGNATURE, array_call=array_call,
        impls=(Impl("torch", name, f"{formula} with torch.nn.functional.rms_norm and silu in float32 at least, "
                    "through autograd",
                    composite, follows=rmsnorm.TORCHS, known_issues=(rmsnorm.BATCH_VARIANCE,)),),
    )


GATE_RMSNORM = gated("gate_rmsnorm", BEFORE, "RMSNorm(x · silu(z)) · w", gate_rms_norm)
RMSNORM_GATE = gated("rmsnorm_gate", AFTER, "RMSNorm(x) · w · silu(z)", rms_norm_gate)
