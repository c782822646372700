"""Value profiles: the distributions of x and dy that expose different classes of numerical bug.

Each profile fills one row per normalisation set (see sets.SetView.to_sets), so "per-set mean and
spread" mean the same thing for BatchNorm and GroupNorm. Values are float64; the case quantises them.
`centred` says which statistic the op normalises by: the variance about the set's mean, or (False:
RMSNorm) the mean of squares; a profile about that statistic (near_constant) follows it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .dtypes import UNIT_ROUNDOFF

Profile = Callable[..., "tuple[np.ndarray, np.ndarray]"]  # (sets, size, dtype, eps, rng, centred=) -> x, dy


def _spacing(magnitude: np.ndarray, dtype: str) -> np.ndarray:
    """Distance between neighbouring `dtype` numbers near `magnitude` (one ulp)."""
    return 2 * UNIT_ROUNDOFF[dtype] * np.exp2(np.floor(np.log2(magnitude)))


def _per_set(rng: np.random.Generator, sets: int, low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, size=(sets, 1))


def normal(sets, size, dtype, eps, rng, centred=True):
    """Well-conditioned data: per-set mean in [-1, 1], spread in [0.5, 2]."""
    x = _per_set(rng, sets, -1, 1) + _per_set(rng, sets, 0.5, 2) * rng.standard_normal((sets, size))
    return x, rng.standard_normal((sets, size))


def offset(sets, size, dtype, eps, rng, centred=True):
    """Cancellation: |mean| in [1e3, 1e4] ≫ spread, for x and (smaller) for dy.

    The spread is at least 16 ulps of the mean in the tested dtype, otherwise quantisation would
    flatten the data into a constant and the profile would test nothing.
    """
    sign = rng.choice([-1.0, 1.0], size=(sets, 1))
    mu = sign * _per_set(rng, sets, 1e3, 1e4)
    sigma = np.maximum(1.0, 16 * _spacing(np.abs(mu), dtype)) * _per_set(rng, sets, 1, 2)
    mu_dy = rng.choice([-1.0, 1.0], size=(sets, 1)) * _per_set(rng, sets, 1e2, 1e3)
    sigma_dy = np.maximum(1.0, 16 * _spacing(np.abs(mu_dy), dtype))
    x = mu + sigma * rng.standard_normal((sets, size))
    dy = mu_dy + sigma_dy * rng.standard_normal((sets, size))
    return x, dy


def near_constant(sets, size, dtype, eps, rng, centred=True):
    """The statistic ≈ eps in odd sets and exactly 0 in even ones: invstd is dominated by eps. Centred:
    variance ≈ eps about a mean in [-1, 1]; uncentred: mean of squares ≈ eps, and even sets all zeros."""
    mu = _per_set(rng, sets, -1, 1) if centred else np.zeros((sets, 1))
    sigma = np.sqrt(eps) * _per_set(rng, sets, 0.3, 3)
    sigma[::2] = 0.0
    x = mu + sigma * rng.standard_normal((sets, size))
    return x, rng.standard_normal((sets, size))


def heavy_tailed(sets, size, dtype, eps, rng, centred=True):
    """Student-t (3 degrees of freedom) x and dy: a few huge elements dominate every sum."""
    x = _per_set(rng, sets, -1, 1) + np.clip(rng.standard_t(3, size=(sets, size)), -1e3, 1e3)
    dy = np.clip(rng.standard_t(3, size=(sets, size)), -1e3, 1e3)
    return x, dy


def exact(sets, size, dtype, eps, rng, centred=True):
    """benchdnn-style data: small integers whose sums are exact in every tested dtype.

    Deviations come in ± pairs inside each set, so each set's mean is an exact integer and every
    partial sum a kernel forms is exactly representable; any error is the kernel's, not the data's.
    """
    half = size // 2
    k = rng.integers(-4, 5, size=(sets, half)).astype(np.float64)
    dev = np.concatenate([k, -k, np.zeros((sets, size - 2 * half))], axis=1)
    dev = rng.permuted(dev, axis=1)
    x = rng.integers(-3, 4, size=(sets, 1)).astype(np.float64) + dev
    dy = rng.integers(-4, 5, size=(sets, size)).astype(np.float64) / 4
    return x, dy


def sparse_dy(sets, size, dtype, eps, rng, centred=True):
    """Mostly-zero upstream gradient (ReLU-like masks, dropped rows); some sets get none at all."""
    x, dy = normal(sets, size, dtype, eps, rng)
    dy[rng.random((sets, size)) < 0.9] = 0.0
    dy[::3] = 0.0
    return x, dy


def tiny(sets, size, dtype, eps, rng, centred=True):
    """Rows of magnitude 1e-3 to 1e-2 (near √eps for eps = 1e-5): the statistic and eps are the same size, so
    a kernel that drops, replaces or hard-codes eps shows; mean and spread scale together."""
    scale = 10 ** _per_set(rng, sets, -3, -2)
    x, dy = normal(sets, size, dtype, eps, rng)
    return scale * x, dy


def big(sets, size, dtype, eps, rng, centred=True):
    """|x| in the hundreds to thousands about a mean in [-1, 1]: x² passes f16's largest value (65504), so
    squares or sums of squares kept in f16 overflow although x, x̂ and every output are representable."""
    x = _per_set(rng, sets, -1, 1) + _per_set(rng, sets, 300, 3000) * rng.standard_normal((sets, size))
    return np.clip(x, -6e4, 6e4), rng.standard_normal((sets, size))


PROFILES: dict[str, Profile] = {
    "normal": normal,
    "offset": offset,
    "near_constant": near_constant,
    "heavy_tailed": heavy_tailed,
    "exact": exact,
    "sparse_dy": sparse_dy,
    "tiny": tiny,
    "big": big,
}
