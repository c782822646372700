"""Adaptive GroupNorm followed by SiLU, as diffusion U-Nets' ResNet blocks apply it (norm, the timestep's scale and
shift, then the nonlinearity): y = SiLU(GroupNorm(x)·(1 + scale) + shift), scale and shift per sample and channel.
adagn's record with an Activation stage after its Scale: the reference, baseline and bound compose from the two
stages (the activation's bound reads the modulated output's, and hands the modulation the error of the dy it
passes on).

SiLU applied before the modulation, its derivative taken at the norm's output instead of the modulated value, the
modulation's gradients taken without SiLU's derivative and SiLU's backward skipped are the bug classes this makes
visible.
"""
from __future__ import annotations

from ..reference.stages import SILU, Activation
from . import adagn, groupnorm
from .core import Impl
from .fused import fused

WHY_ONCE = ("the double backward and forward mode of a fused modulation and epilogue are not judged yet: the "
            "directional-derivative formulas (reference.setwise) stop at the norm's output")


def modulate_silu(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    """The eager composite: F.silu of adagn's (F.group_norm · (1 + scale) + shift)."""
    import torch.nn.functional as F
    return F.silu(adagn.modulate(input, scale, shift, num_groups, weight, bias, eps))


OP = fused(
    groupnorm.OP, adagn.OP.stages + (Activation(SILU),),
    name="adagn_silu", description="adaptive GroupNorm then SiLU: SiLU(GroupNorm(x)·(1 + scale) + shift), scale and "
    "shift per sample and channel",
    signature="fn(input, scale, shift, num_groups, weight, bias, eps) -> Tensor  (silu(group_norm(input)·(1 + scale) "
              "+ shift); scale and shift shaped (N, C), broadcast over the spatial dims)",
    call=adagn.call, outputs=adagn.OP.outputs, required=adagn.OP.required, operands=adagn.OPERANDS,
    double_backward=False, why_once_differentiable=WHY_ONCE,
    array_signature=adagn.ARRAY_SIGNATURE.replace("-> y", "-> SiLU(y)"), array_call=adagn.array_call,
    impls=(Impl("torch", "adagn_silu", "F.silu of F.group_norm · (1 + scale) + shift, through autograd", modulate_silu,
                known_issues=groupnorm.TORCH_ISSUES),),
)
