"""Adaptive (modulated) LayerNorm, as a diffusion transformer's blocks use it (DiT's adaLN): a LayerNorm whose
output each sample scales and shifts by vectors of its own, computed from the conditioning.

Math
----
x (N, *S, *D): N samples, each a sequence S of rows of H = prod(D) values; scale and shift (N, *D), one vector
per sample, broadcast over its sequence::

    ŷ = LN(x; γ, β)           the LayerNorm of each row (γ, β optional, per element of D)
    y = ŷ · (1 + scale) + shift

For L = <dy, y>, with m = 1 + scale broadcast over S::

    dŷ = dy · m                dx, dγ, dβ: LayerNorm's backward of dŷ
    dscale = Σ_S dy · ŷ        dshift = Σ_S dy          (per sample: summed over its sequence only)

Summing dscale/dshift over the batch too, modulating by scale instead of 1 + scale and leaving m out of dx are
the bug classes this makes visible.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._moments import NormBackward, as_working
from .layernorm import layer_norm_backward, layer_norm_forward

__all__ = ["Modulation", "ADALN", "adaln_forward", "adaln_backward"]


@dataclass(frozen=True)
class Modulation:
    """A per-sample modulation a fused norm applies to its output: y = ŷ·(1 + `scale`) + `shift`, the two operands
    shaped (N, *D) and broadcast over the sequence, with gradients `dscale` and `dshift` (the tolerance model
    bounds it through the inner norm, reading the geometry from here)."""
    scale: str
    shift: str
    dscale: str
    dshift: str

    @staticmethod
    def broadcast(a, x_ndim: int) -> np.ndarray:
        """A per-sample (N, *D) array as (N, 1, ..., 1, *D): broadcast over the sequence dims of an x of x_ndim
        dims."""
        a = as_working(a)
        return a.reshape(a.shape[:1] + (1,) * (x_ndim - a.ndim) + a.shape[1:])

    @staticmethod
    def sequence_sum(a: np.ndarray, per_sample_ndim: int) -> np.ndarray:
        """Σ over the sequence dims of an x-shaped array: (N, *S, *D) -> (N, *D)."""
        axes = tuple(range(1, a.ndim - per_sample_ndim + 1))
        return a.sum(axis=axes) if axes else a


ADALN = Modulation("scale", "shift", "dscale", "dshift")


def adaln_forward(x, scale, shift, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """y = LN(x)·(1 + scale) + shift."""
    x = as_working(x)
    y_norm = layer_norm_forward(x, normalized_shape, weight, bias, eps).y
    return y_norm * (1 + ADALN.broadcast(scale, x.ndim)) + ADALN.broadcast(shift, x.ndim)


@dataclass(frozen=True)
class AdaLNBackward:
    dx: np.ndarray
    dscale: np.ndarray
    dshift: np.ndarray
    dweight: np.ndarray | None
    dbias: np.ndarray | None


def adaln_backward(dy, x, scale, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> AdaLNBackward:
    """The gradients of <dy, y>: LayerNorm's backward of dy·(1 + scale), and the sequence sums of dy·ŷ and dy."""
    x, dy = as_working(x), as_working(dy)
    per_sample = np.ndim(scale)
    y_norm = layer_norm_forward(x, normalized_shape, weight, bias, eps).y
    inner: NormBackward = layer_norm_backward(dy * (1 + ADALN.broadcast(scale, x.ndim)), x, normalized_shape, weight,
                                              eps, has_bias=bias is not None)
    return AdaLNBackward(inner.dx, ADALN.sequence_sum(dy * y_norm, per_sample), ADALN.sequence_sum(dy, per_sample),
                         inner.dweight, inner.dbias)
