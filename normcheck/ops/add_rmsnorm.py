"""Residual add + RMSNorm: h = x + residual (in the residual stream's dtype), y = RMSNorm(h); returns (y, h)."""
from __future__ import annotations

from . import rmsnorm
from .core import Impl
from .layernorm import normalized_shape
from .residual import STREAM_RETURNED, add_norm

SIGNATURE = ("fn(input, residual, normalized_shape, weight, eps) -> (y, h)  (h = input + residual in the residual "
             "dtype, y = rms_norm(h) in input's dtype; eps may be None)")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["residual"], normalized_shape(case), t.weight, case.eps)


def composite(rms_norm):
    """add + `rms_norm` (F.rms_norm's signature) as eager code writes it: the add in the residual's dtype, the norm
    of the sum, y back in input's dtype."""
    def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None):
        h = input.to(residual.dtype) + residual
        return rms_norm(h, normalized_shape, weight, eps).to(input.dtype), h

    add_rms_norm.__qualname__ = "add_rms_norm"  # (importable as this module's add_rms_norm: spec_of)
    return add_rms_norm


# The eager composite, on F.rms_norm without its warning for half input with float32 weight (torch.compile's record
# compiles composite(F.rms_norm): that warning filter is a graph break, which would leave the norm eager)
add_rms_norm = composite(rmsnorm.rms_norm)


OP = add_norm(rmsnorm.OP, "add_rmsnorm", "residual add + RMSNorm: h = x + residual, y = RMSNorm(h); returns y and h",
              SIGNATURE, call, impls=(
                  Impl("torch", "add_rmsnorm", "x + residual, then torch.nn.functional.rms_norm, through autograd",
                       add_rms_norm, follows={**rmsnorm.TORCHS, **STREAM_RETURNED},
                       known_issues=(rmsnorm.BATCH_VARIANCE,)),
              ))
