"""GroupNorm followed by SiLU, fused (on one device; syncbn_silu is its across-ranks sibling): y names SiLU(GN(x))."""
from __future__ import annotations

from ..reference.stages import SILU, Activation
from . import groupnorm
from .core import Impl
from .fused import fused

WHY_ONCE = ("the double backward and forward mode of a fused epilogue are not judged yet: the directional-derivative "
            "formulas (reference.setwise) stop at the norm's output")


# groupnorm's array contract, returning the fused output
ARRAY_SIGNATURE = groupnorm.ARRAY_SIGNATURE.replace("-> y", "-> SiLU(GroupNorm(x))")


def group_norm_silu(input, num_groups, weight=None, bias=None, eps=1e-5):
    """The eager composite: F.silu of F.group_norm."""
    import torch.nn.functional as F
    return F.silu(F.group_norm(input, num_groups, weight, bias, eps))


OP = fused(
    groupnorm.OP, (Activation(SILU),), name="groupnorm_silu",
    description="GroupNorm followed by SiLU, fused (the output is SiLU(GN(x)); y names that output)",
    signature="fn(input, num_groups, weight, bias, eps) -> SiLU(GroupNorm(input))",
    outputs=("y", "dx", "dweight", "dbias"), saved_stats=(),
    double_backward=False, why_once_differentiable=WHY_ONCE, array_signature=ARRAY_SIGNATURE,
    array_call=groupnorm.array_call,
    impls=(Impl("torch", "groupnorm_silu", "torch.nn.functional.silu of group_norm, through autograd", group_norm_silu,
                known_issues=groupnorm.TORCH_ISSUES),),
)
