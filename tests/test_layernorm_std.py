"""The annotated transformer's LayerNorm (normcheck/ops/layernorm_std.py): its reference, which follows from its
statistic form alone (unbiased std, eps outside the root), against torch's float64 autograd at first order, in the
double backward and in forward-over-reverse, and against central differences of its own first order; the data
profiles aim at its eps. (Its torch records, correct styles and mutants are judged by the template tests from the
record and tests/mutants/layernorm_std.py.)"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from normcheck import Case
from normcheck.engine.expected import expected_outputs
from tests._form_checks import (WRT, assert_double_backward_is_the_derivative_of_the_first_order,
                                 assert_directional_derivatives_are_torchs, tensors)

PATHS = [dict(), dict(frozen="x"), dict(frozen="params"), dict(affine="weight")]


def torch_layer_norm_std(x, weight, bias, eps, dims):
    """The tutorial's formula in float64: a_2 * (x - mean) / (std + eps) + b_2."""
    mean, std = x.mean(dims, keepdim=True), x.std(dims, keepdim=True)
    y = (x - mean) / (std + eps)
    y = y if weight is None else weight * y
    return y if bias is None else y + bias


def _formula(t):
    return torch_layer_norm_std(t["x"], t["weight"], t["bias"], 1e-2, (-2, -1))


def _case(shape, order=1, profile="normal", **path):
    return Case("layernorm_std", shape, "f64", profile=profile, eps=1e-2, normalized_dims=2, order=order, **path)


def test_the_reference_is_torchs_float64_autograd_with_a_row_of_equal_values():
    """First order: y, dx, dγ, dβ as torch's autograd gives them, a row of equal values included (std = 0: torch's
    std backward takes 0 there, as the form's reference does)."""
    inputs = _case((5, 3, 4)).make_inputs()
    x = inputs.x.copy()
    x[2] = 0.7  # a row of equal values
    x[4] *= 1e-3  # a row whose std is below eps
    inputs = replace(inputs, x=x)
    ref = expected_outputs(inputs.case, inputs)
    t = tensors(inputs)
    grads_of = inputs.case.grads
    y = _formula(t)
    grads = torch.autograd.grad(y, [t[WRT[g]] for g in grads_of], t["dy"])
    np.testing.assert_allclose(ref["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name, grad in zip(grads_of, grads):
        np.testing.assert_allclose(ref[name], grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=name)
    # eps outside the root, the std unbiased: the constant row is β, the small one x̂ = (x − μ)/(std + eps)
    np.testing.assert_allclose(ref["y"][2], np.broadcast_to(inputs.bias, (3, 4)), rtol=1e-12)
    g = inputs.weight * inputs.dy[2]
    np.testing.assert_allclose(ref["dx"][2], (g - g.mean()) / 1e-2, rtol=1e-12)  # r = 1/eps, and no x̂·h term


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "all")
@pytest.mark.parametrize("order", [2, "fwd-rev"])
def test_the_directional_derivatives_are_torchs_float64_ones(order, path):
    """The double backward and forward-over-reverse follow from the form (λ = 1 + eps/std and its rate): torch's
    float64 autograd of the tutorial's formula, on rows whose std is near eps as well as far above it."""
    inputs = _case((6, 3, 4), order=order, **path).make_inputs()
    x = inputs.x.copy()
    x[1] = 0.3 + 1e-3 * (x[1] - x[1].mean())  # std ~ eps/10
    inputs = replace(inputs, x=x)
    assert_directional_derivatives_are_torchs(inputs, _formula)


@pytest.mark.parametrize("profile", ["normal", "near_constant"])
def test_the_double_backward_is_the_derivative_of_the_first_order_reference(profile):
    """d2x, d2γ and d2dy against central differences of the first-order reference (near_constant: rows whose std is
    about eps, without its rows of equal values, where the second derivative has a kink)."""
    inputs = _case((6, 5, 3), order=2, profile=profile).make_inputs()
    if profile == "near_constant":
        inputs = replace(inputs, x=inputs.x[1::2].repeat(2, axis=0), dy=inputs.dy, ddx=inputs.ddx)
    h = 1e-7 if profile == "near_constant" else 1e-5
    assert_double_backward_is_the_derivative_of_the_first_order(inputs, h)


def test_the_near_constant_profile_puts_rows_on_both_sides_of_eps():
    """The profile aims its data at eps for the op's statistic (eps outside the root: std ≈ eps), so that eps inside
    the root, or dropped from the backward, has rows to fail on."""
    inputs = Case("layernorm_std", (64, 16), "f32", profile="near_constant", eps=1e-2, normalized_dims=1).make_inputs()
    std = inputs.x.std(axis=-1, ddof=1)
    odd = std[1::2]
    assert (odd < 1e-2).any() and (odd > 1e-2).any() and (std[::2] == 0).all()


def test_torchs_nan_double_backward_on_rows_of_equal_values_is_its_known_issue_and_a_guarded_one_passes():
    """torch's x.std() has a NaN second derivative where std = 0 (near_constant's even rows); the record says so, and
    a backward whose 1/std is guarded there (the fused textbook) passes the same case."""
    from normcheck import compare
    from normcheck.engine import FAIL, KNOWN
    from normcheck.ops.layernorm_std import ZERO_STD_DOUBLE_BACKWARD
    from tests.mutants import bound
    from tests.mutants.layernorm_std import CORRECT

    case = Case("layernorm_std", (4, 16), "f64", profile="near_constant", eps=1e-2, order=2, normalized_dims=1)
    report = compare("layernorm_std", "torch", case)
    assert report.verdict == KNOWN and ZERO_STD_DOUBLE_BACKWARD.key in report.message
    assert report.worst.name == "d2x" and "NaN" in report.message
    assert compare("layernorm_std", bound("layernorm_std", CORRECT["fused"]), case).verdict not in (FAIL, KNOWN)


@pytest.mark.parametrize("order", [1, 2, "fwd-rev"])
def test_a_float32_kernel_whose_mean_of_equal_values_rounds_passes_and_its_bound_says_why(order):
    """A row of equal values whose mean a float32 kernel rounds: its deviations are rounding's, pointing anywhere, and
    λ·h = Σ(g·d)/((H − 1)·std) with them (the fused textbook's); the bound's range for such sets (StatisticForm.ambiguous,
    error_terms.kink_spread) takes it there, many times the rounding bound."""
    from normcheck import compare
    from normcheck.engine import FAIL
    from normcheck.engine.tolerance import element_bounds
    from tests.mutants import bound
    from tests.mutants.layernorm_std import CORRECT

    case = Case("layernorm_std", (64, 7), "f32", profile="near_constant", eps=1e-6, normalized_dims=1, order=order,
                seed=1)
    assert compare("layernorm_std", bound("layernorm_std", CORRECT["fused"]), case).verdict != FAIL
    inputs = case.make_inputs()
    name = {1: "dx", 2: "d2dy", "fwd-rev": "jvp_y"}[order]
    with_range = element_bounds(case, inputs)[name]
    statistics = __import__("normcheck.numerics.statistics", fromlist=["StatisticForm"]).StatisticForm
    ambiguous, statistics.ambiguous = statistics.ambiguous, lambda self, s, ds, eps: None
    try:
        without = element_bounds(case, inputs)[name]
    finally:
        statistics.ambiguous = ambiguous
    equal_rows = np.ptp(inputs.x, axis=-1) == 0  # (and rows whose few distinct values are rounding's, near them)
    assert (with_range >= without).all() and (with_range[equal_rows] > 10 * without[equal_rows]).any()
