"""Float64 NumPy reference for RMSNorm over the last k dims: forward and backward.

Math
----
x (*rows, *D) with k = len(D) = len(normalized_shape) and H = prod(D).  Each row is one set of H
values; nothing is centred::

    ms = mean(x**2)       rstd = 1 / sqrt(ms + eps)       xhat = x * rstd
    y = w'_d * q(xhat)    w' = w + offset                 (w absent: y = q(xhat))

``offset`` is the weight convention (1.0 for Gemma's zero-centred weight) and ``q`` the casting
chain: the identity when everything is computed in float32 and rounded once at the end, the
rounding of x̂ to the input dtype when a kernel rounds before the weight multiply (Llama), or
q(x · q(rstd)) when it rounds rstd to the input dtype and forms x · rstd there.  For
L = sum(y * dy), with g = w' * dy (q is passed straight through, as autograd does for a cast)::

    d rstd / d x_j = -rstd**3 * x_j / H
    dx_j = rstd * g_j - x_j * rstd**3 * sum(g * x) / H = rstd * (g_j - xhat_j * mean(g * xhat))

which is the LayerNorm formula without its mean(g) term (no mean was subtracted).  The weight
gradient sums over the rows, seeing x̂ as the weight did: ``dweight_d = sum_rows dy * q(xhat)``.
rstd has torch's shape (*rows, 1, ..., 1).  There is no bias.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

import numpy as np

from ._moments import NormBackward, as_rows, check_dy, check_eps, groups, inv_sqrt, per_element, working

__all__ = ["RMSNormForward", "rms_norm_backward", "rms_norm_forward"]

_OP = "rms_norm"
Rounding = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None  # q(x̂, x, rstd): x̂ as the weight sees it


@dataclass(frozen=True)
class RMSNormForward:
    y: np.ndarray  # same shape as x
    rstd: np.ndarray  # (*rows, 1, ..., 1)  1 / sqrt(mean(x**2) + eps)


def _scale(weight, d: tuple[int, ...], offset: float) -> np.ndarray | None:
    """w + offset, flattened over D (None without a weight)."""
    w = per_element(weight, d, "weight", _OP)
    return None if w is None else w + float(offset)


def _statistics(x2: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """rstd (rows, 1) and x̂ of a (rows, H) block."""
    ms = np.einsum("ij,ij->i", x2, x2) / x2.shape[1]
    rstd = inv_sqrt(ms, eps)[:, None]
    with np.errstate(invalid="ignore"):  # a zero row with eps = 0: 0 * inf is NaN, as in torch
        return rstd, x2 * rstd


def rms_norm_forward(x, normalized_shape, weight=None, eps: float = 1e-6, offset: float = 0.0,
                     rounding: Rounding = None) -> RMSNormForward:
    """RMSNorm forward in float64 (inputs are not modified)."""
    x, rows, d = as_rows(x, normalized_shape, _OP)
    eps, scale = check_eps(eps, _OP), _scale(weight, d, offset)
    flat = x.reshape(prod(rows), prod(d))
    y, rstd = np.empty_like(flat), np.empty((flat.shape[0], 1), working())
    for part in groups(flat.shape[0], max(flat.shape[1], 1)):
        rstd[part], xhat = _statistics(flat[part], eps)
        seen = xhat if rounding is None else rounding(xhat, flat[part], rstd[part])
        y[part] = seen if scale is None else seen * scale
    return RMSNormForward(y.reshape(x.shape), rstd.reshape(rows + (1,) * len(d)))


def rms_norm_backward(dy, x, normalized_shape, weight=None, eps: float = 1e-6, offset: float = 0.0,
                      rounding: Rounding = None) -> NormBackward:
    """RMSNorm backward in float64; statistics are recomputed from ``x``.

    Returns the gradients of ``sum(y * dy)``: ``dx`` and ``dweight`` (None without a weight),
    shaped like D; ``dbias`` is None (the layer has no bias)."""
    x, rows, d = as_rows(x, normalized_shape, _OP)
    dy = check_dy(dy, x.shape, _OP)
    eps, scale = check_eps(eps, _OP), _scale(weight, d, offset)
    flat, dflat = x.reshape(prod(rows), prod(d)), dy.reshape(prod(rows), prod(d))
    dx = np.empty_like(flat)
    dweight = None if scale is None else np.zeros(flat.shape[1], working())
    for part in groups(flat.shape[0], max(flat.shape[1], 1)):
        rstd, xhat = _statistics(flat[part], eps)
        g = dflat[part] if scale is None else dflat[part] * scale
        h = np.einsum("ij,ij->i", g, xhat)[:, None] / max(flat.shape[1], 1)
        dx[part] = rstd * (g - xhat * h)
        if dweight is not None:
            dweight += np.einsum("ij,ij->j", dflat[part], xhat if rounding is None else rounding(xhat, flat[part], rstd))
    return NormBackward(dx.reshape(x.shape), None if dweight is None else dweight.reshape(d), None)
