"""Budget ratios per channel (BatchNorm) or group (GroupNorm): the breakdown --plot and --json show."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normcheck import Case, compare
from normcheck.engine.report import unit_ratios


def bn_channel_1_off(x, running_mean, running_var, weight, bias, training, momentum, eps):
    y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return y + torch.tensor([0.0, 1e-3, 0.0]).view(1, 3, *([1] * (x.dim() - 2))).to(y.dtype)


def gn_channel_5_off(x, num_groups, weight, bias, eps):
    y = F.group_norm(x, num_groups, weight, bias, eps)
    return y + (torch.arange(x.shape[1]) == 5).to(y.dtype).view(1, -1, *([1] * (x.dim() - 2))) * 1e-3


@pytest.mark.parametrize("op, impl, case, bad_unit", [
    ("batchnorm", bn_channel_1_off, Case("batchnorm", (4, 3, 6), "f64"), 1),
    ("groupnorm", gn_channel_5_off, Case("groupnorm", (2, 8, 5), "f64", groups=4), 2),  # channels 4, 5: group 2
])
def test_an_error_in_one_channel_shows_in_that_unit_only(op, impl, case, bad_unit):
    y = compare(op, impl, case).tensor("y")
    ratios = np.array(y.unit_ratios)
    units = case.groups or case.channels
    assert len(ratios) == units and y.verdict == "FAIL"
    assert ratios[bad_unit] == y.max_ratio > 1
    assert all(ratios[u] <= 1 for u in range(units) if u != bad_unit)


@pytest.mark.parametrize("case", [
    Case("batchnorm", (4, 3, 6), "bf16"),
    Case("groupnorm", (3, 6, 2, 2), "f16", groups=3),
    Case("groupnorm", (3, 6), "f32", groups=2),
])
def test_the_units_cover_the_tensor(case):
    # Every per-unit value is the max of a disjoint part of the tensor, so their max is the tensor's.
    for t in compare(case.op, "torch", case).tensors:
        assert len(t.unit_ratios) == (case.groups or case.channels) and max(t.unit_ratios) == t.max_ratio, t.name


def test_every_layout_of_per_unit_tensors_reduces_to_units():
    ratio = np.arange(2 * 6 * 5, dtype=float).reshape(2, 6, 5)           # (N, C, L), 3 groups of 2 channels
    assert unit_ratios(ratio, 3).tolist() == [39.0, 49.0, 59.0]
    assert unit_ratios(np.array([[1.0, 5.0, 2.0], [4.0, 0.0, 3.0]]), 3).tolist() == [4.0, 5.0, 3.0]  # (N, G)
    assert unit_ratios(np.array([1.0, np.nan, 2.0]), 3).tolist() == [1.0, np.inf, 2.0]  # NaN counts as inf
    assert unit_ratios(np.zeros((0, 3, 4)), 3).tolist() == [0.0, 0.0, 0.0]                # an empty batch
