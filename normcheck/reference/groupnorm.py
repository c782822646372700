"""Float64 NumPy reference for GroupNorm: forward and backward.

Math
----
x (N, C, *spatial) with C = G * Cg.  Each (n, g) pair is one normalisation set: its
L = Cg * prod(spatial) values.  Over a set::

    mu = mean(x)          var = mean((x - mu)**2)      # biased; two passes, never E[x^2]-E[x]^2
    rstd = 1 / sqrt(var + eps)      xhat = (x - mu) * rstd      y = gamma_c * xhat + beta_c

gamma and beta are per *channel*, so unlike BatchNorm gamma varies inside a set.  For the
scalar loss L = sum(y * dy), dL/dxhat = g = gamma_c * dy, and the BatchNorm derivation (see
``batchnorm``) applies unchanged with the set in place of the channel::

    d xhat_i / d x_j = rstd * (delta_ij - 1/L - xhat_i * xhat_j / L)
    dx_j = rstd * (g_j - mean(g) - xhat_j * mean(g * xhat))      # means over the set

gamma stays inside the means: ``mean(g) = sum_c gamma_c * sum_s dy / L``.  The parameter
gradients sum over the batch and the spatial positions of each channel:
``dweight_c = sum_{n,s} dy * xhat`` (xhat uses the set's own statistics) and
``dbias_c = sum_{n,s} dy``.

Implementation: sets are rows of the ``(N*G, Cg, S)`` view, processed in cache-sized groups
of rows (see ``_moments``); within a group ``x - mu`` is written straight into the output,
which is then finished in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._moments import (
    GROUP_ELEMS,
    NormBackward,
    as_ncs,
    check_dy,
    check_eps,
    dot_r,
    dot_rows,
    groups,
    inv_sqrt,
    per_channel,
    scratch_like,
    sum_r,
    sum_rows,
    working,
)

__all__ = ["GroupNormForward", "NormBackward", "group_norm_backward", "group_norm_forward"]

_OP = "group_norm"
_BUDGET = GROUP_ELEMS // 2  # see GROUP_ELEMS


@dataclass(frozen=True)
class GroupNormForward:
    y: np.ndarray  # same shape as x
    mean: np.ndarray  # (N, G)
    rstd: np.ndarray  # (N, G)  1 / sqrt(biased var + eps)


def _sets(x, num_groups) -> tuple[np.ndarray, np.ndarray]:
    """Validate; return float64 x and its ``(N*G, Cg, S)`` view (one row per set)."""
    xf, x3 = as_ncs(x, _OP)
    n, c, s = x3.shape
    if (
        isinstance(num_groups, bool)
        or not isinstance(num_groups, (int, np.integer))
        or num_groups < 1
    ):
        raise ValueError(f"{_OP}: num_groups must be a positive integer, got {num_groups!r}")
    g = int(num_groups)
    if c % g != 0:
        raise ValueError(
            f"{_OP}: number of channels C={c} must be divisible by num_groups={g} "
            f"(x shape {xf.shape})"
        )
    if n > 0 and c * s == 0:
        raise ValueError(f"{_OP}: each group needs at least one value, got x shape {xf.shape}")
    return xf, x3.reshape(n * g, c // g, s)


def _per_set_channel(v: np.ndarray | None, n: int, g: int) -> np.ndarray | None:
    """Per-channel vector (C,) laid out as the ``(N*G, Cg)`` rows of the set view."""
    return None if v is None else np.tile(v.reshape(g, -1), (n, 1))


def _centre(xs: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two-pass statistics of the sets (rows) in ``xs``: mean and sum of squared deviations.

    Leaves ``x - mean`` in ``out``. In float64 (the reference's own precision) the mean is refined by the mean of
    those deviations: a sum of values of |mean| ≫ std rounds by about u·|mean|·log(count), the same for every element
    of the set, which a sum over the set's dy (dγ's, adaLN's dscale) multiplies by the count; refined, ``x − mean`` is
    right to u·|x| (found on 2x65x2048 G=5 f64 with |mean| ≈ 8e3, std ≈ 1.5: every implementation agreed to 1e-10
    relative, the unrefined reference was off by one budget). The same-precision baseline keeps a kernel's one pass.
    """
    count = xs.shape[1] * xs.shape[2]
    mean = sum_rows(xs) / count
    np.subtract(xs, mean[:, None, None], out=out)
    if working() is np.float64:
        fix = sum_rows(out) / count
        mean += fix
        out -= fix[:, None, None]
    return mean, dot_rows(out, out)


def group_norm_forward(x, num_groups, weight=None, bias=None, eps: float = 1e-5) -> GroupNormForward:
    """GroupNorm forward in float64 (inputs are not modified)."""
    xf, xs3 = _sets(x, num_groups)
    n, c = xf.shape[:2]
    g = int(num_groups)
    eps = check_eps(eps, _OP)
    w = _per_set_channel(per_channel(weight, c, "weight", _OP), n, g)
    b = _per_set_channel(per_channel(bias, c, "bias", _OP), n, g)

    y = np.empty(xf.shape, working())
    ys3 = y.reshape(xs3.shape)
    rows, cg, s = xs3.shape
    mean, rstd = np.empty(rows, working()), np.empty(rows, working())
    for sp in groups(rows, cg * s, budget=_BUDGET):
        ys = ys3[sp]
        mean[sp], ssq = _centre(xs3[sp], ys)  # y = x - mu
        rstd[sp] = inv_sqrt(ssq / (cg * s), eps)
        if w is None:
            ys *= rstd[sp, None, None]
        else:
            ys *= (w[sp] * rstd[sp, None])[:, :, None]
        if b is not None:
            ys += b[sp, :, None]
    return GroupNormForward(y=y, mean=mean.reshape(n, g), rstd=rstd.reshape(n, g))


def group_norm_backward(
    dy, x, num_groups, weight=None, eps: float = 1e-5, has_bias: bool = True
) -> NormBackward:
    """GroupNorm backward in float64; statistics are recomputed from ``x``.

    Returns the gradients of ``sum(y * dy)``: ``dx``, ``dweight`` (None when ``weight`` is
    None) and ``dbias`` (None when ``has_bias`` is False).
    """
    xf, xs3 = _sets(x, num_groups)
    n, c = xf.shape[:2]
    g = int(num_groups)
    eps = check_eps(eps, _OP)
    weight = per_channel(weight, c, "weight", _OP)
    w = _per_set_channel(weight, n, g)
    dys3 = check_dy(dy, xf.shape, _OP).reshape(xs3.shape)

    dx = np.empty(xf.shape, working())
    dxs3 = dx.reshape(xs3.shape)
    rows, cg, s = xs3.shape
    size = cg * s
    # per (set, channel-in-set) sums over the spatial positions, for dweight / dbias
    sum_dy = np.empty((rows, cg), working())
    sum_dy_xhat = np.empty((rows, cg), working())
    buf: list = []
    for sp in groups(rows, size, budget=_BUDGET):
        dys, dxs = dys3[sp], dxs3[sp]
        _, ssq = _centre(xs3[sp], dxs)  # dx = x - mu
        rstd = inv_sqrt(ssq / size, eps)[:, None]
        sum_dy[sp] = sum_r(dys)
        sum_dy_xhat[sp] = rstd * dot_r(dys, dxs)

        # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = gamma_c * dy,
        # evaluated as  (x - mu) * coef_d + const + dy * coef_dy  with dx holding x - mu.
        gam = 1.0 if w is None else w[sp]
        mean_g = (gam * sum_dy[sp]).sum(axis=1, keepdims=True) / size
        mean_g_xhat = (gam * sum_dy_xhat[sp]).sum(axis=1, keepdims=True) / size
        dxs *= (-rstd * rstd * mean_g_xhat)[:, :, None]
        dxs -= (rstd * mean_g)[:, :, None]
        t = scratch_like(dys, buf)
        np.multiply(dys, (rstd * gam)[:, :, None], out=t)
        dxs += t

    dweight = None if weight is None else sum_dy_xhat.reshape(n, c).sum(axis=0)
    dbias = sum_dy.reshape(n, c).sum(axis=0) if has_bias else None
    return NormBackward(dx=dx, dweight=dweight, dbias=dbias)
