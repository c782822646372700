"""Value profiles produce the statistics they promise (meta-tests of the case generator)."""
import numpy as np
import pytest

from normcheck import Case
from normcheck.numerics.profiles import PROFILES


def sets(case):
    inputs = case.make_inputs()
    return case.view.to_sets(inputs.x), case.view.to_sets(inputs.dy)


@pytest.mark.parametrize("dtype", ["f64", "f32", "f16", "bf16"])
def test_offset_means_dominate_spread_but_data_is_not_flattened(dtype):
    x, dy = sets(Case("batchnorm", (8, 6, 16), dtype, profile="offset"))
    mean, std = np.abs(x.mean(axis=1)), x.std(axis=1)
    assert (mean >= 900).all() and (std > 0).all()
    assert (mean / std).max() > (3 if dtype == "bf16" else 30)  # cancellation is real
    assert all(len(np.unique(row)) > 8 for row in x)           # quantisation did not flatten it
    assert (np.abs(dy.mean(axis=1)) > 50).all()


def test_near_constant_has_exact_zero_and_eps_sized_variance():
    case = Case("groupnorm", (4, 8, 5, 5), "f64", profile="near_constant", groups=4)
    x, _ = sets(case)
    var = x.var(axis=1)
    assert (x[::2].max(axis=1) == x[::2].min(axis=1)).all()  # every value identical: variance exactly 0
    assert ((var[1::2] > 0.01 * case.eps) & (var[1::2] < 20 * case.eps)).all()


def test_heavy_tailed_has_outliers():
    x, dy = sets(Case("batchnorm", (64, 4, 32), "f64", profile="heavy_tailed"))
    kurtosis = ((x - x.mean(1, keepdims=True)) ** 4).mean(1) / x.var(1) ** 2
    assert (kurtosis > 4).all()  # a normal distribution has 3


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_exact_profile_sums_are_exact_integers(dtype):
    x, dy = sets(Case("batchnorm", (6, 5, 7), dtype, profile="exact"))
    assert np.array_equal(x, np.round(x))
    means = x.mean(axis=1)
    assert np.array_equal(means, np.round(means))  # ± pairs: each set's mean is an integer
    assert np.array_equal(dy * 4, np.round(dy * 4))


def test_sparse_dy_is_mostly_zero_with_empty_sets():
    _, dy = sets(Case("batchnorm", (8, 7, 32), "f32", profile="sparse_dy"))
    assert 0.85 < (dy == 0).mean() < 0.99
    assert (dy[::3] == 0).all() and (dy[1] != 0).any()


@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_profile_is_finite_in_every_dtype(profile):
    for dtype in ("f64", "f32", "f16", "bf16"):
        inputs = Case("groupnorm", (2, 4, 6, 6), dtype, profile=profile, groups=2).make_inputs()
        assert np.isfinite(inputs.x).all() and np.isfinite(inputs.dy).all()
