"""Residual add + RMSNorm: h = x + residual (in the residual stream's dtype), y = RMSNorm(h); returns (y, h)."""
from __future__ import annotations

from . import rmsnorm
from .core import Impl
from .layernorm import normalized_shape
from .residual import add_norm

SIGNATURE = ("fn(input, residual, normalized_shape, weight, eps) -> (y, h)  (h = input + residual in the residual "
             "dtype, y = rms_norm(h) in input's dtype; eps may be None)")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["residual"], normalized_shape(case), t.weight, case.eps)


def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None):
    """The eager composite: the add in the residual's dtype, F.rms_norm of the sum, y back in input's dtype."""
    h = input.to(residual.dtype) + residual
    return rmsnorm.rms_norm(h, normalized_shape, weight, eps).to(input.dtype), h


OP = add_norm(rmsnorm.OP, "add_rmsnorm", "residual add + RMSNorm: h = x + residual, y = RMSNorm(h); returns y and h",
              SIGNATURE, call, impls=(
                  Impl("torch", "add_rmsnorm", "x + residual, then torch.nn.functional.rms_norm, through autograd",
                       add_rms_norm, follows={**rmsnorm.TORCHS, "residual_dtype": "input"}),
                  Impl("torch-f32-residual", "add_rmsnorm", "the same composite with the residual stream in float32",
                       add_rms_norm, follows={**rmsnorm.TORCHS, "residual_dtype": "f32"}),
              ))
