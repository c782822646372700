"""Float64 NumPy reference for LayerNorm over the last k dims: forward and backward.

Math
----
x (*rows, *D) with k = len(D) = len(normalized_shape) and H = prod(D).  Each row (a position of
the leading dims) is one normalisation set of H values::

    mu = mean(x)          var = mean((x - mu)**2)      # biased; two passes
    rstd = 1 / sqrt(var + eps)      xhat = (x - mu) * rstd      y = gamma_d * xhat + beta_d

gamma and beta are indexed by the position d in D, so they vary inside a set.  This is exactly
GroupNorm with one group on x viewed as (rows, H): every row a sample, every element of D a
channel, no spatial dims.  Its derivation applies unchanged (see ``groupnorm``)::

    dx_j = rstd * (g_j - mean(g) - xhat_j * mean(g * xhat)),   g = gamma * dy,  means over the row
    dweight_d = sum_rows dy * xhat        dbias_d = sum_rows dy

so the functions here reshape and call the GroupNorm reference (one verified implementation of
the formula, not two).  mean and rstd have torch's shape: (*rows, 1, ..., 1).  An input with no
rows is allowed (empty outputs, zero parameter gradients).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ._moments import NormBackward, as_rows, check_dy, per_element
from .groupnorm import group_norm_backward, group_norm_forward

__all__ = ["LayerNormForward", "layer_norm_backward", "layer_norm_forward"]

_OP = "layer_norm"


@dataclass(frozen=True)
class LayerNormForward:
    y: np.ndarray  # same shape as x
    mean: np.ndarray  # (*rows, 1, ..., 1)
    rstd: np.ndarray  # (*rows, 1, ..., 1)  1 / sqrt(biased var + eps)


def layer_norm_forward(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> LayerNormForward:
    """LayerNorm forward in float64 (inputs are not modified)."""
    x, rows, d = as_rows(x, normalized_shape, _OP)
    f = group_norm_forward(x.reshape(prod(rows), prod(d)), 1, per_element(weight, d, "weight", _OP), per_element(bias, d, "bias", _OP), eps)
    stats = rows + (1,) * len(d)
    return LayerNormForward(f.y.reshape(x.shape), f.mean.reshape(stats), f.rstd.reshape(stats))


def layer_norm_backward(dy, x, normalized_shape, weight=None, eps: float = 1e-5, has_bias: bool = True) -> NormBackward:
    """LayerNorm backward in float64; statistics are recomputed from ``x``.

    Returns the gradients of ``sum(y * dy)``: ``dx``, ``dweight`` (None when ``weight`` is None)
    and ``dbias`` (None when ``has_bias`` is False), the parameter gradients shaped like D."""
    x, rows, d = as_rows(x, normalized_shape, _OP)
    dy = check_dy(dy, x.shape, _OP)
    flat = (prod(rows), prod(d))
    b = group_norm_backward(dy.reshape(flat), x.reshape(flat), 1, per_element(weight, d, "weight", _OP), eps, has_bias)
    shaped = (lambda g: None if g is None else g.reshape(d))
    return NormBackward(b.dx.reshape(x.shape), shaped(b.dweight), shaped(b.dbias))
