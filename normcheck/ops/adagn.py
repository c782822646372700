"""Adaptive GroupNorm, as diffusion U-Nets' ResNet blocks condition on the timestep: y = GroupNorm(x)·(1 + scale) +
shift, scale and shift one value per sample and channel (N, C), broadcast over the spatial dims. The GroupNorm
record with one Scale stage after it (reference.stages: dŷ = dy·(1 + scale), dscale = Σ_spatial dy·ŷ, dshift =
Σ_spatial dy, per sample and channel). GroupNorm's channels, groups, spatial sizes, layouts and eps; its own γ, β
optional.

Modulating by scale instead of 1 + scale, the modulation's gradients summed over the batch, dscale taken of x
instead of the normalised x, dx without the modulation and the per-channel vectors indexed by group instead of channel
are the bug classes this makes visible.
"""
from __future__ import annotations

from ..reference.stages import ONE_PLUS, PER_CHANNEL, Scale
from . import groupnorm
from .adaln import modulation_values
from .core import Impl, Operand
from .fused import fused

WHY_ONCE = ("the double backward and forward mode of an adaptive GroupNorm are not judged yet: the "
            "directional-derivative formulas (reference.setwise) are a norm's of its own inputs, not of a modulation's")


def per_channel(case) -> tuple[int, ...]:
    """The modulation's shape: one value per sample and channel."""
    return case.shape[:2]


OPERANDS = (Operand("scale", shape=per_channel, draw=modulation_values, gradient="dscale"),
            Operand("shift", shape=per_channel, draw=modulation_values, gradient="dshift"))


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["scale"], t.extra["shift"], case.groups, t.weight, t.bias, case.eps)


ARRAY_SIGNATURE = ("fn(x, scale, shift, weight, bias, *, num_groups, eps, channel_axis) -> y  (groupnorm's, with scale "
                   "and shift after x, shaped (N, C))")


def array_call(fn, a, case):
    return fn(a.x, a.extra["scale"], a.extra["shift"], a.weight, a.bias, num_groups=case.groups, eps=case.eps,
              channel_axis=a.channel_axis)


def modulate(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    """The eager composite, as diffusion U-Nets write it: F.group_norm, then · (1 + scale) + shift over the spatial
    dims."""
    import torch.nn.functional as F
    over_spatial = (1,) * (input.dim() - 2)
    y = F.group_norm(input, num_groups, weight, bias, eps)
    return y * (1 + scale.reshape(*scale.shape, *over_spatial)) + shift.reshape(*shift.shape, *over_spatial)


OP = fused(
    groupnorm.OP, (Scale("scale", ONE_PLUS, ("dscale", "dshift"), shift="shift", broadcast=PER_CHANNEL),),
    name="adagn", description="adaptive GroupNorm: GroupNorm(x)·(1 + scale) + shift, scale and shift per sample and "
    "channel",
    signature="fn(input, scale, shift, num_groups, weight, bias, eps) -> Tensor  (group_norm(input)·(1 + scale) + "
              "shift; scale and shift shaped (N, C), broadcast over the spatial dims)",
    call=call, outputs=("y", "mean", "rstd", "dx", "dscale", "dshift", "dweight", "dbias"),
    required=("y", "dx", "dscale", "dshift", "dweight", "dbias"), operands=OPERANDS, double_backward=False,
    why_once_differentiable=WHY_ONCE, array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(Impl("torch", "adagn", "F.group_norm · (1 + scale) + shift, through autograd", modulate,
                known_issues=groupnorm.TORCH_ISSUES),),
)
