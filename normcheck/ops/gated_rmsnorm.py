"""Gated RMSNorm, as state-space and linear-attention blocks use it: RMSNorm and a SiLU gate z, one value per element
of x, on either side of the norm. Two records, each the RMSNorm record with one Scale stage (reference.stages):

    gate_rmsnorm    y = RMSNorm(x · silu(z)) · w     the gate before the norm (Mamba2's RMSNormGated, its default
                                                     norm_before_gate=False)
    rmsnorm_gate    y = RMSNorm(x) · w · silu(z)     the norm before the gate (norm_before_gate=True; fused
                                                     linear-attention kernels' gated output norm)

The grouped RMSNorm record (ops.grouped_rmsnorm) is their inner norm: its rows, hidden sizes, group sizes
(statistics per group of the row, as Mamba2's group_size), eps and conventions (weight offset, casting chain); the
gate's gradient dgate is shaped like x. Applying the gate on the wrong side, the gate's derivative taken as σ(z),
leaving the gate out of dx and statistics of the ungated x are the bug classes this makes visible.
"""
from __future__ import annotations

import numpy as np

from ..reference.stages import AFTER, BEFORE, SILU, Scale
from . import grouped_rmsnorm, rmsnorm
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
    return fn(t.x, t.extra["gate"], normalized_shape(case), t.weight, case.eps,
              **grouped_rmsnorm.group_keywords(fn, case))


ARRAY_SIGNATURE = ("fn(x, gate, weight, *, axes, eps[, group_size]) -> y  (grouped_rmsnorm's, with the gate after x: "
                   "shaped like x; eps: a number)")


def array_call(fn, a, case):
    return fn(a.x, a.extra["gate"], a.weight, axes=normalized_axes(case), eps=case.eps_value,
              **grouped_rmsnorm.group_keywords(fn, case))


def gate_rms_norm(input, gate, normalized_shape, weight=None, eps=None, group_size=None):
    """The gate before the norm, as Mamba2's reference writes it: x · silu(z) and the (grouped) RMSNorm of it in
    float32 at least, y back in input's dtype."""
    import torch.nn.functional as F
    x, z = grouped_rmsnorm.upcast(input, gate)
    return grouped_rmsnorm.grouped_rms_norm(x * F.silu(z), normalized_shape, weight, eps, group_size).to(input.dtype)


def rms_norm_gate(input, gate, normalized_shape, weight=None, eps=None, group_size=None):
    """The norm before the gate, as Mamba2's reference writes it: the (grouped) RMSNorm of x · silu(z) in float32 at
    least, y back in input's dtype."""
    import torch.nn.functional as F
    x, z = grouped_rmsnorm.upcast(input, gate)
    y = grouped_rmsnorm.grouped_rms_norm(x, normalized_shape, weight, eps, group_size)
    return (y * F.silu(z)).to(input.dtype)


def gated(name: str, side: str, formula: str, composite) -> Op:
    """The grouped RMSNorm record with a SiLU gate `side` of the norm."""
    return fused(
        grouped_rmsnorm.OP, (Scale("gate", SILU, ("dgate",), side=side),), name=name,
        description=f"gated RMSNorm: {formula}, the gate z per element",
        signature=f"fn(input, gate, normalized_shape, weight, eps[, group_size]) -> Tensor  ({formula}; gate shaped "
                  "like input; eps may be None; group_size=G given where the case has groups)",
        call=call, outputs=("y", "rstd", "dx", "dgate", "dweight"), required=("y", "dx", "dgate", "dweight"),
        operands=OPERANDS, double_backward=False,
        why_once_differentiable=WHY_ONCE, array_signature=ARRAY_SIGNATURE, array_call=array_call,
        layer_switches=(("norm_before_gate", side == AFTER),),  # (Mamba2's RMSNormGated, given by class)
        impls=(Impl("torch", name, f"{formula} with torch.nn.functional.rms_norm (over each group) and silu in "
                    "float32 at least, through autograd",
                    composite, follows=rmsnorm.TORCHS, known_issues=(rmsnorm.BATCH_VARIANCE,)),),
    )


GATE_RMSNORM = gated("gate_rmsnorm", BEFORE, "RMSNorm(x · silu(z)) · w", gate_rms_norm)
RMSNORM_GATE = gated("rmsnorm_gate", AFTER, "RMSNorm(x) · w · silu(z)", rms_norm_gate)
