"""Float64 NumPy reference for training-mode BatchNorm: forward and backward.

Math
----
For each channel c, over the M = N * prod(spatial) values of that channel::

    mu = mean(x)          var = mean((x - mu)**2)      # biased; two passes, never E[x^2]-E[x]^2
    invstd = 1 / sqrt(var + eps)       xhat = (x - mu) * invstd       y = gamma * xhat + beta

Backward of the scalar loss L = sum(y * dy).  dL/dxhat = g = gamma * dy.  With
d mu / dx_j = 1/M and d var / dx_j = 2 (x_j - mu) / M (the part through mu vanishes because
sum(x - mu) = 0), d invstd / dx_j = -invstd**3 (x_j - mu) / M = -invstd**2 xhat_j / M, so::

    d xhat_i / d x_j = invstd * (delta_ij - 1/M - xhat_i * xhat_j / M)
    dx_j = sum_i g_i d xhat_i / d x_j = invstd * (g_j - mean(g) - xhat_j * mean(g * xhat))

gamma is constant over the channel, hence ``dx = gamma*invstd*(dy - mean(dy) - xhat*mean(dy*xhat))``;
``dweight = sum(dy * xhat)`` and ``dbias = sum(dy)`` (sums over N and spatial).  The code
evaluates exactly this form, starting from ``x - mu``.

The running statistics follow torch: ``(1-momentum)*running + momentum*batch`` with the
unbiased batch variance ``var * M / (M - 1)``.

Implementation: channels are processed in cache-sized groups (see ``_moments``); within a
group ``x - mu`` is written straight into the output array, which is then finished in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._moments import (
    MIN_RUN,
    NormBackward,
    as_ncs,
    channel_rows,
    check_dy,
    check_eps,
    dot_pr,
    groups,
    inv_sqrt,
    per_channel,
    sum_pr,
    working,
)

__all__ = ["BatchNormForward", "NormBackward", "batch_norm_backward", "batch_norm_forward"]

_OP = "batch_norm"


@dataclass(frozen=True)
class BatchNormForward:
    y: np.ndarray  # same shape as x
    mean: np.ndarray  # (C,)
    invstd: np.ndarray  # (C,)  1 / sqrt(biased var + eps)
    running_mean: np.ndarray | None  # (C,) updated copy; None when not given
    running_var: np.ndarray | None  # (C,) updated copy (unbiased batch var); None when not given


def _check_count(x: np.ndarray, count: int, need_two: bool) -> None:
    if x.size == 0:
        raise ValueError(f"{_OP}: x must have at least one value per channel, got shape {x.shape}")
    if need_two and count < 2:
        raise ValueError(
            f"{_OP}: Expected more than 1 value per channel when training, got input size "
            f"{x.shape} (running_var needs the unbiased variance, i.e. N*prod(spatial) >= 2)"
        )


def _groups(x3: np.ndarray) -> list[tuple[slice, list[slice]]]:
    """``(channels, [batch blocks])`` pairs covering the ``(N, C, S)`` array.

    Whole channels are grouped to about GROUP_ELEMS elements, taking at least MIN_RUN
    elements per sample so a group is not a gather of tiny runs.  A group that is still too
    big (a huge batch) is walked in batch blocks, one sweep per pass; usually there is one block.
    """
    n, c, s = x3.shape
    out = []
    for sq in groups(c, n * s, min_units=-(-MIN_RUN // s)):
        q = len(range(*sq.indices(c)))
        out.append((sq, groups(n, q * s)))
    return out


def _centre(x3, out3, sq, batches, count):
    """Two-pass statistics of channels ``sq``: mean and sum of squared deviations.

    Leaves ``x - mean`` in ``out3[:, sq]``.
    """
    mean = sum(sum_pr(x3[sn, sq]) for sn in batches) / count
    mean_rows = channel_rows(mean, x3.shape[2])
    ssq = 0.0
    for sn in batches:
        d = out3[sn, sq]
        np.subtract(x3[sn, sq], mean_rows, out=d)
        ssq = ssq + dot_pr(d, d)
    return mean, ssq


def batch_norm_forward(
    x,
    weight=None,
    bias=None,
    running_mean=None,
    running_var=None,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> BatchNormForward:
    """Training-mode BatchNorm forward in float64 (inputs are not modified)."""
    xf, x3 = as_ncs(x, _OP)
    n, c, s = x3.shape
    count = n * s
    eps = check_eps(eps, _OP)
    w = per_channel(weight, c, "weight", _OP)
    b = per_channel(bias, c, "bias", _OP)
    rm = per_channel(running_mean, c, "running_mean", _OP)
    rv = per_channel(running_var, c, "running_var", _OP)
    _check_count(xf, count, need_two=rv is not None)

    y = np.empty(xf.shape, working())
    y3 = y.reshape(x3.shape)
    mean, ssq, invstd = np.empty(c, working()), np.empty(c, working()), np.empty(c, working())
    for sq, batches in _groups(x3):
        mean[sq], ssq[sq] = _centre(x3, y3, sq, batches, count)  # y = x - mu
        invstd[sq] = inv_sqrt(ssq[sq] / count, eps)
        scale = channel_rows(invstd[sq] if w is None else w[sq] * invstd[sq], s)
        shift = None if b is None else channel_rows(b[sq], s)
        for sn in batches:
            ys = y3[sn, sq]
            ys *= scale
            if shift is not None:
                ys += shift

    new_rm = None if rm is None else (1.0 - momentum) * rm + momentum * mean
    new_rv = None if rv is None else (1.0 - momentum) * rv + momentum * (ssq / (count - 1))
    return BatchNormForward(y=y, mean=mean, invstd=invstd, running_mean=new_rm, running_var=new_rv)


def batch_norm_backward(dy, x, weight=None, eps: float = 1e-5, has_bias: bool = True) -> NormBackward:
    """Training-mode BatchNorm backward in float64; statistics are recomputed from ``x``.

    Returns the gradients of ``sum(y * dy)``: ``dx``, ``dweight`` (None when ``weight`` is
    None) and ``dbias`` (None when ``has_bias`` is False).
    """
    xf, x3 = as_ncs(x, _OP)
    n, c, s = x3.shape
    count = n * s
    eps = check_eps(eps, _OP)
    w = per_channel(weight, c, "weight", _OP)
    dy3 = check_dy(dy, xf.shape, _OP).reshape(x3.shape)
    _check_count(xf, count, need_two=False)

    dx = np.empty(xf.shape, working())
    dx3 = dx.reshape(x3.shape)
    sum_dy, sum_dy_xhat = np.empty(c, working()), np.empty(c, working())
    for sq, batches in _groups(x3):
        _, ssq = _centre(x3, dx3, sq, batches, count)  # dx = x - mu
        invstd = inv_sqrt(ssq / count, eps)
        sum_dy[sq] = sum(sum_pr(dy3[sn, sq]) for sn in batches)
        sum_dy_xhat[sq] = invstd * sum(dot_pr(dy3[sn, sq], dx3[sn, sq]) for sn in batches)

        # dx = gamma*invstd * (dy - mean(dy) - xhat*mean(dy*xhat)), with dx holding x - mu
        coef_d = channel_rows(-invstd * sum_dy_xhat[sq] / count, s)  # -xhat*mean(dy*xhat)
        minus_mean_dy = channel_rows(-sum_dy[sq] / count, s)
        scale = channel_rows(invstd if w is None else w[sq] * invstd, s)
        for sn in batches:
            dxs = dx3[sn, sq]
            dxs *= coef_d
            dxs += dy3[sn, sq]
            dxs += minus_mean_dy
            dxs *= scale

    dweight = None if w is None else sum_dy_xhat
    dbias = sum_dy if has_bias else None
    return NormBackward(dx=dx, dweight=dweight, dbias=dbias)
