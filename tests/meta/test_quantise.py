"""normcheck.numerics.dtypes.quantise rounds exactly as torch's `.to(dtype)` does, so every framework
sees the inputs the reference sees: bit for bit, ties, overflow, subnormals and NaN included."""
import numpy as np
import pytest
import torch

from normcheck.frameworks.torch import TORCH_DTYPES
from normcheck.numerics.dtypes import DTYPES, FP8_FORMATS, TINY, UNIT_ROUNDOFF, may_round_across, quantise


def candidates() -> np.ndarray:
    with np.errstate(all="ignore"):  # overflowing and non-finite candidates are the point
        return _candidates()


def _candidates() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(200_000) * np.exp2(rng.integers(-140, 130, 200_000))
    halves = []
    for dt in (np.float16, np.float32):
        q = x.astype(dt).astype(np.float64)
        ulp = np.spacing(np.abs(q).astype(dt)).astype(np.float64)
        halves += [q + ulp / 2, q - ulp / 2, q + ulp / 2 * (1 + 2.0**-40), q + ulp / 2 * (1 - 2.0**-40)]
    # bf16 ties: values halfway between bf16 neighbours, and a hair either side (double rounding through f32)
    b = torch.from_numpy(x).to(torch.bfloat16).double().numpy()
    bulp = np.exp2(np.floor(np.log2(np.abs(b) + 1e-300)) - 7)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 3.4e38, 3.39e38, 1e-45, 6e-8, 1e300, -1e300]
    return np.concatenate([x, *halves, b + bulp / 2, b + bulp / 2 * (1 + 2.0**-30), b - bulp / 2, special])


def fp8_candidates(dtype: str) -> np.ndarray:
    """Every fp8 number's midpoints with its neighbours, a hair either side of them (double rounding through f32),
    and a fine grid past both formats' largest values (saturation and overflow)."""
    every = torch.arange(256, dtype=torch.uint8).view(TORCH_DTYPES[dtype]).double().numpy()
    q = np.unique(np.abs(every[np.isfinite(every)]))
    mids = (q[1:] + q[:-1]) / 2
    near = [mids * (1 + k) for k in (0, 2.0**-30, -2.0**-30, 2.0**-20, -2.0**-20)]
    return np.concatenate([candidates(), *near, *(-m for m in near), np.arange(-70000, 70000, 0.25)])


@pytest.mark.parametrize("dtype", DTYPES + FP8_FORMATS)
def test_quantise_is_bit_identical_to_torch(dtype):
    values = fp8_candidates(dtype) if dtype in FP8_FORMATS else candidates()
    ours = quantise(values, dtype)
    with np.errstate(invalid="ignore"):
        theirs = torch.from_numpy(values).to(TORCH_DTYPES[dtype]).double().numpy()
    same = (ours.view(np.uint64) == theirs.view(np.uint64)) | (np.isnan(ours) & np.isnan(theirs))
    assert same.all(), f"{(~same).sum()} values differ, e.g. {values[~same][:3]}"


def test_the_comparison_sees_a_single_rounding_instead_of_torchs_double_rounding():
    # f64 -> f16 directly differs from torch's f64 -> f32 -> f16 on some ties: the test above would see it
    values = candidates()
    with np.errstate(over="ignore", invalid="ignore"):
        direct = values.astype(np.float16).astype(np.float64)
    theirs = torch.from_numpy(values).to(torch.float16).double().numpy()
    assert ((direct != theirs) & ~np.isnan(theirs)).any()


@pytest.mark.parametrize("dtype", DTYPES + FP8_FORMATS)
def test_tiny_is_torchs_smallest_normal(dtype):
    assert TINY[dtype] == torch.finfo(TORCH_DTYPES[dtype]).tiny


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "e4m3", "e5m2"])
def test_may_round_across_finds_every_value_that_rounds_to_another_neighbour_when_nudged(dtype):
    """Brute force: values around powers of two and between (below a power of two the spacing halves, so the
    midpoint there is a quarter of q's ulp away), each nudged by ± its error: where the two roundings differ,
    may_round_across must say so with at least the step rounding made."""
    rng = np.random.default_rng(0)
    powers = np.exp2(rng.integers(-6, 6, 400).astype(np.float64))
    values = powers * (1 + rng.uniform(-0.02, 0.02, 400)) * rng.choice([-1.0, 1.0], 400)
    values = np.concatenate([values, rng.uniform(-3, 3, 400)])
    error = np.abs(values) * UNIT_ROUNDOFF[dtype] * rng.uniform(0, 0.5, values.size)  # (under half an ulp: one step)
    up, down = quantise(values + error, dtype), quantise(values - error, dtype)
    flips = may_round_across(values, error, dtype)
    moved = np.maximum(np.abs(up - quantise(values, dtype)), np.abs(down - quantise(values, dtype)))
    assert np.all(flips >= moved), f"{int(np.sum(flips < moved))} values round across unseen"
    assert np.any(flips == 0)  # (and it does not say every value may)
