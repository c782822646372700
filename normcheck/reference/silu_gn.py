"""SiLU ∘ GroupNorm: the output of a fused GroupNorm + SiLU layer (diffusion U-Nets' ResNet blocks), and its gradients.

With y = GN(x) and z = SiLU(y) = y·σ(y), dz/dy = σ(y)·(1 + y·(1 − σ(y))) (reference.silu_bn): the backward is the
GroupNorm backward of dy = dz·σ(y)·(1 + y·(1 − σ(y))).
"""
from __future__ import annotations

import numpy as np

from ._moments import NormBackward, working
from .groupnorm import group_norm_backward, group_norm_forward
from .silu_bn import silu, silu_grad


def silu_gn_forward(x, num_groups, weight=None, bias=None, eps=1e-5) -> np.ndarray:
    return silu(group_norm_forward(x, num_groups, weight, bias, eps).y)


def silu_gn_backward(dz, x, num_groups, weight=None, bias=None, eps=1e-5) -> NormBackward:
    y = group_norm_forward(x, num_groups, weight, bias, eps).y
    dy = np.asarray(dz, dtype=working()) * silu_grad(y)
    return group_norm_backward(dy, x, num_groups, weight, eps, has_bias=bias is not None)
