"""SimpleNorm (timm; normcheck/ops/simplenorm.py): its reference, which follows from its statistic form (the unbiased
variance about the mean, eps added to it) with the output uncentred, against torch's float64 autograd at first order,
in the double backward and in forward-over-reverse, and against central differences of its own first order; the data
profiles aim at its statistic about the mean; a backward that takes x for x − μ fails. (Its torch record, correct
styles and mutants are judged by the template tests from the record and tests/mutants/simplenorm.py.)"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from normcheck import Case, compare
from normcheck.engine import FAIL
from normcheck.engine.expected import expected_outputs
from tests._form_checks import (WRT, assert_double_backward_is_the_derivative_of_the_first_order,
                                 assert_directional_derivatives_are_torchs, tensors)
from tests.mutants import bound
from tests.mutants.simplenorm import CORRECT, MUTANTS

PATHS = [dict(), dict(frozen="x"), dict(frozen="params")]
EPS = 1e-2


def torch_simple_norm(x, weight):
    """x · rsqrt(var(x) + eps) · w over the last two dims, var unbiased, in float64 (timm's simple_norm)."""
    y = x * torch.rsqrt(torch.var(x, dim=(-2, -1), keepdim=True) + EPS)
    return y if weight is None else y * weight


def _formula(t):
    return torch_simple_norm(t["x"], t["weight"])


def _case(shape, order=1, profile="normal", **path):
    return Case("simplenorm", shape, "f64", profile=profile, eps=EPS, normalized_dims=2, order=order, **path)


def _rows(inputs):
    """Row 2 of equal values (var = 0), row 4 far off its mean (a mean 100 times its spread)."""
    x = inputs.x.copy()
    x[2] = 0.7
    x[4] = 50.0 + 0.5 * (x[4] - x[4].mean())
    return replace(inputs, x=x)


def test_the_reference_is_torchs_float64_autograd():
    """First order: y, dx, dγ as torch's autograd gives them, with a row of equal values (y = x/√eps, dx = g/√eps:
    its deviations are 0) and a row far off its mean, where x·r and the statistic's (x − μ)·r differ most."""
    inputs = _rows(_case((5, 3, 4)).make_inputs())
    ref = expected_outputs(inputs.case, inputs)
    t = tensors(inputs)
    y = _formula(t)
    grads = torch.autograd.grad(y, [t[WRT[g]] for g in inputs.case.grads], t["dy"])
    np.testing.assert_allclose(ref["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name, grad in zip(inputs.case.grads, grads):
        np.testing.assert_allclose(ref[name], grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(ref["y"][2], 0.7 / np.sqrt(EPS) * inputs.weight, rtol=1e-12)
    np.testing.assert_allclose(ref["dx"][2], inputs.weight * inputs.dy[2] / np.sqrt(EPS), rtol=1e-12)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "all")
@pytest.mark.parametrize("order", [2, "fwd-rev"])
def test_the_directional_derivatives_are_torchs_float64_ones(order, path):
    """The double backward and forward-over-reverse, the statistic's deviations and their tangent (ẋ − mean(ẋ)) where
    x̂·H enters, x's elsewhere: torch's float64 autograd, a row far off its mean among them."""
    inputs = _rows(_case((6, 3, 4), order=order, **path).make_inputs())
    assert_directional_derivatives_are_torchs(inputs, _formula)


@pytest.mark.parametrize("profile", ["normal", "near_constant"])
def test_the_double_backward_is_the_derivative_of_the_first_order_reference(profile):
    """d2x, d2γ and d2dy against central differences of the first-order reference (near_constant: rows whose variance
    is about eps)."""
    inputs = _case((6, 5, 3), order=2, profile=profile).make_inputs()
    assert_double_backward_is_the_derivative_of_the_first_order(inputs, 1e-7 if profile == "near_constant" else 1e-5)


def test_the_near_constant_profile_is_about_the_rows_mean():
    """The statistic is about the mean, so the profile's rows are: a variance about eps around means of size 1 (an
    uncentred op's would be zero-mean), even rows of one value."""
    inputs = Case("simplenorm", (64, 16), "f32", profile="near_constant", eps=EPS, normalized_dims=1).make_inputs()
    x = inputs.x.astype(np.float64)
    var, mean = x.var(axis=-1, ddof=1), x.mean(axis=-1)
    odd = var[1::2]
    assert (odd < EPS).any() and (odd > EPS).any() and (var[::2] == 0).all() and np.abs(mean).max() > 0.5


def test_a_backward_with_x_for_its_deviations_fails_and_the_textbook_passes():
    """dx = r·(g − x·r·h), the statistic's x − μ taken as x (RMSNorm's backward reused), fails a float32 case by dx;
    the fused textbook, r·(g − (x − μ)·r·h), passes it."""
    case = Case("simplenorm", (8, 64), "f32", eps=1e-6, normalized_dims=1)
    report = compare("simplenorm", bound("simplenorm", MUTANTS["rms_norm_backward"]), case)
    assert report.verdict == FAIL and report.worst.name == "dx", report.summary()
    assert compare("simplenorm", bound("simplenorm", CORRECT["fused"]), case).verdict != FAIL
