"""Float64 NumPy reference for ScaleNorm over the last k dims: forward and backward.

Math
----
x (*rows, *D), H = prod(D) values per row; one scalar gain g' = g + offset for the whole layer::

    r = 1 / max(‖x‖, eps)         xhat = x * r         y = g' * xhat

eps floors the norm, as the layers written with F.normalize or norm.clamp(min=eps) do; with ``floor=False`` it
is added to Σx² instead, r = 1 / sqrt(Σx² + eps), as RMSNorm adds it to the mean of squares.  For
L = sum(y * dy), with g = g' * dy::

    r moves with x:   dx = r * (g - xhat * sum(g * xhat))       (d r / d x_j = -r**3 * x_j)
    ‖x‖ < eps floor:  dx = r * g                                 (r = 1/eps does not depend on x)
    dg = sum over every element of dy * xhat

which is RMSNorm's formula with the row's total in place of its mean.  A zero row with eps = 0 gives
0 * inf = NaN, as in torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ._moments import NormBackward, as_rows, check_dy, check_eps, working

__all__ = ["ScaleNormForward", "scale_norm_backward", "scale_norm_forward"]

_OP = "scale_norm"


@dataclass(frozen=True)
class ScaleNormForward:
    y: np.ndarray  # same shape as x
    rstd: np.ndarray  # (*rows, 1, ..., 1)  1 / max(‖x‖, eps)


def _gain(weight, offset: float) -> np.ndarray | None:
    if weight is None:
        return None
    w = np.asarray(weight, working())
    if w.size != 1:
        raise ValueError(f"{_OP}: the gain is one value, got shape {w.shape}")
    return w.reshape(()) + float(offset)


def _normalised(flat: np.ndarray, eps: float, floor: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """r (rows, 1), x̂ and where eps floors the norm (rows, 1) of a (rows, H) block."""
    squares = np.einsum("ij,ij->i", flat, flat)[:, None]
    norm = np.sqrt(squares)
    with np.errstate(divide="ignore", invalid="ignore"):  # (a zero row with eps = 0: 0 * inf is NaN, as in torch)
        r = 1.0 / (np.maximum(norm, eps) if floor else np.sqrt(squares + eps))
        return r, flat * r, norm < eps if floor else np.zeros_like(squares, dtype=bool)


def scale_norm_forward(x, normalized_shape, weight=None, eps: float = 0.0, offset: float = 0.0,
                       floor: bool = True) -> ScaleNormForward:
    """ScaleNorm forward in float64 (inputs are not modified)."""
    x, rows, d = as_rows(x, normalized_shape, _OP)
    eps, gain = check_eps(eps, _OP), _gain(weight, offset)
    r, xhat, _ = _normalised(x.reshape(prod(rows), prod(d)), eps, floor)
    y = xhat if gain is None else xhat * gain
    return ScaleNormForward(y.reshape(x.shape), r.reshape(rows + (1,) * len(d)))


def scale_norm_backward(dy, x, normalized_shape, weight=None, eps: float = 0.0, offset: float = 0.0,
                        floor: bool = True) -> NormBackward:
    """ScaleNorm backward in float64: ``dx`` and ``dweight`` (shaped like the gain; None without one)."""
    x, rows, d = as_rows(x, normalized_shape, _OP)
    dy = check_dy(dy, x.shape, _OP)
    eps, gain = check_eps(eps, _OP), _gain(weight, offset)
    flat, dflat = x.reshape(prod(rows), prod(d)), dy.reshape(prod(rows), prod(d))
    r, xhat, floored = _normalised(flat, eps, floor)
    g = dflat if gain is None else dflat * gain
    h = np.where(floored, 0.0, np.einsum("ij,ij->i", g, xhat)[:, None])
    dx = r * (g - xhat * h)
    dweight = None if gain is None else np.sum(dflat * xhat, dtype=working()).reshape(np.shape(weight))
    return NormBackward(dx.reshape(x.shape), dweight, None)
