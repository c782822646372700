"""Implementations that cannot do everything a sweep designs, as kernel authors and model libraries write them, for
tests/test_judged_coverage.py; module-level, so the isolated world's worker process imports them.

* LayerNorm as a custom autograd.Function whose backward is marked @once_differentiable and that has no jvp (the usual
  shape of a Triton, CUDA or fused kernel), and the same with a bf16 path for rows of two values that is wrong;
* modules that hold a torch norm class as a submodule: BatchNorm2d (4-D input only, as the class checks) and
  InstanceNorm2d as that class defaults (no weight, no bias, no running statistics; 4-D input, 3-D read unbatched);
* a BatchNorm function for 4-D input only, raising on any other rank (no signal: its rows FAIL, and a hint names
  the option).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


class _OnceDifferentiableLayerNorm(torch.autograd.Function):
    """torch's LayerNorm, its backward through autograd inside a @once_differentiable backward; no jvp."""

    @staticmethod
    def forward(ctx, x, weight, bias, shape, eps):
        ctx.save_for_backward(x, weight, bias)
        ctx.shape, ctx.eps = shape, eps
        return F.layer_norm(x, shape, weight, bias, eps)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, weight, bias)]
            y = F.layer_norm(leaves[0], ctx.shape, leaves[1], leaves[2], ctx.eps)
            given = [t for t in leaves if t is not None]
            grads = iter(torch.autograd.grad(y, given, dy))
        return (*(next(grads) if t is not None else None for t in leaves), None, None)


def once_differentiable_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _OnceDifferentiableLayerNorm.apply(input, weight, bias, tuple(normalized_shape), eps)


class WrapsBatchNorm2d(nn.Module):
    """A block's norm: nn.BatchNorm2d as a submodule, called in forward (it raises on input that is not 4-D)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features, eps=eps, momentum=momentum)

    def forward(self, x):
        return self.bn(x)


class WrapsInstanceNorm2d(nn.Module):
    """nn.InstanceNorm2d as a submodule, as that class defaults: no weight and no bias."""

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.norm = nn.InstanceNorm2d(num_features, eps=eps)

    def forward(self, x):
        return self.norm(x)


def bf16_pair_row_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The once-differentiable kernel with a bf16 path of its own for rows of two values (a two-lane reduction
    specialised for half types) that is off by 0.05 in y: a bug on one pair of levels, bf16 x hidden 2."""
    y = once_differentiable_layer_norm(input, normalized_shape, weight, bias, eps)
    row = 1
    for size in normalized_shape:
        row *= size
    return y + 0.05 if input.dtype == torch.bfloat16 and row == 2 else y


def batch_norm_4d_only(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """torch's BatchNorm for (N, C, H, W) input only: any other rank raises, as a 2-D kernel's entry check does."""
    if input.dim() != 4:
        raise ValueError(f"expected 4D input (got {input.dim()}D input)")
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
