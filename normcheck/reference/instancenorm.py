"""Float64 NumPy reference for InstanceNorm (training: the input's own statistics): forward and backward.

Math
----
x (N, C, *spatial), S = prod(spatial) >= 2.  Each (n, c) pair is one normalisation set of S values::

    mu_nc = mean(x_nc)     var_nc = mean((x_nc - mu_nc)**2)     rstd = 1 / sqrt(var_nc + eps)
    y = gamma_c * (x - mu_nc) * rstd + beta_c

This is GroupNorm with one channel per group (G = C): gamma is constant inside a set, and the
GroupNorm derivation applies unchanged (``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with
g = gamma * dy; ``dweight_c = sum_{n,s} dy * xhat``, ``dbias_c = sum_{n,s} dy``), so the functions here
call the GroupNorm reference.  The running statistics, when given, are updated with the *batch average*
of the per-instance statistics, the variance unbiased within its instance (S - 1), as torch does::

    running_mean = (1 - m) * running_mean + m * mean_n(mu_nc)
    running_var  = (1 - m) * running_var  + m * mean_n(var_nc * S / (S - 1))
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._moments import NormBackward, as_ncs, check_eps, per_channel
from .groupnorm import group_norm_backward, group_norm_forward

__all__ = ["InstanceNormForward", "instance_norm_backward", "instance_norm_forward"]

_OP = "instance_norm"


@dataclass(frozen=True)
class InstanceNormForward:
    y: np.ndarray  # same shape as x
    running_mean: np.ndarray | None  # (C,) updated; None when none was given
    running_var: np.ndarray | None  # (C,) updated (unbiased per instance, averaged over the batch)


def _spatial(x) -> tuple[np.ndarray, np.ndarray]:
    x, ncs = as_ncs(x, _OP)
    if x.ndim < 3 or ncs.shape[2] < 2:
        raise ValueError(f"{_OP}: x must have spatial dims with at least 2 values per instance, got shape {x.shape}")
    return x, ncs


def instance_norm_forward(x, weight=None, bias=None, running_mean=None, running_var=None, momentum: float = 0.1,
                          eps: float = 1e-5) -> InstanceNormForward:
    """InstanceNorm forward in float64 with the input's statistics (inputs are not modified)."""
    x, ncs = _spatial(x)
    c, s = ncs.shape[1], ncs.shape[2]
    eps = check_eps(eps, _OP)
    y = group_norm_forward(x, c, weight, bias, eps).y
    rm, rv = per_channel(running_mean, c, "running_mean", _OP), per_channel(running_var, c, "running_var", _OP)
    if (rm is None) != (rv is None):
        raise ValueError(f"{_OP}: give both running_mean and running_var, or neither")
    if rm is None:
        return InstanceNormForward(y, None, None)
    mu = ncs.mean(axis=2)
    unbiased = ((ncs - mu[:, :, None]) ** 2).sum(axis=2) / (s - 1)  # two passes
    m = float(momentum)
    return InstanceNormForward(y, (1 - m) * rm + m * mu.mean(axis=0), (1 - m) * rv + m * unbiased.mean(axis=0))


def instance_norm_backward(dy, x, weight=None, eps: float = 1e-5, has_bias: bool = True) -> NormBackward:
    """InstanceNorm backward in float64 (the input's statistics, recomputed from ``x``)."""
    x, ncs = _spatial(x)
    return group_norm_backward(dy, x, ncs.shape[1], weight, eps, has_bias)
