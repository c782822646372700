"""RMSNorm with eps outside the root (normcheck/ops/rmsnorm_eps_out.py): its reference, which follows from its
statistic form alone (the mean of squares, eps outside the root), against torch's float64 autograd at first order,
in the double backward and in forward-over-reverse, and against central differences of its own first order; the data
profiles aim at its eps; torch's NaN double backward of a zero row is its known issue. (Its torch record, correct
styles and mutants are judged by the template tests from the record and tests/mutants/rmsnorm_eps_out.py.)"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from normcheck import Case, compare
from normcheck.engine import FAIL, KNOWN
from normcheck.engine.expected import expected_outputs
from tests._form_checks import (WRT, assert_double_backward_is_the_derivative_of_the_first_order,
                                 assert_directional_derivatives_are_torchs, tensors)
from normcheck.ops.rmsnorm_eps_out import ZERO_ROW_DOUBLE_BACKWARD
from tests.mutants import bound
from tests.mutants.rmsnorm_eps_out import CORRECT

PATHS = [dict(), dict(frozen="x"), dict(frozen="params")]
EPS = 1e-2


def torch_rms_norm_eps_out(x, weight):
    """x / (‖x‖·H^(−1/2) + eps) · w over the last two dims, in float64."""
    rms = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) / (x.shape[-2] * x.shape[-1]) ** 0.5
    y = x / (rms + EPS)
    return y if weight is None else y * weight


def _formula(t):
    return torch_rms_norm_eps_out(t["x"], t["weight"])


def _case(shape, order=1, profile="normal", **path):
    return Case("rmsnorm_eps_out", shape, "f64", profile=profile, eps=EPS, normalized_dims=2, order=order, **path)


def test_the_reference_is_torchs_float64_autograd_with_a_zero_row():
    """First order: y, dx, dγ as torch's autograd gives them, a zero row included (the norm's derivative, masked
    there, takes no part: dx = g/eps) and a row whose rms is below eps."""
    inputs = _case((5, 3, 4)).make_inputs()
    x = inputs.x.copy()
    x[2] = 0.0
    x[4] *= 1e-3
    inputs = replace(inputs, x=x)
    ref = expected_outputs(inputs.case, inputs)
    t = tensors(inputs)
    grads_of = inputs.case.grads
    y = _formula(t)
    grads = torch.autograd.grad(y, [t[WRT[g]] for g in grads_of], t["dy"])
    np.testing.assert_allclose(ref["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    for name, grad in zip(grads_of, grads):
        np.testing.assert_allclose(ref[name], grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(ref["dx"][2], inputs.weight * inputs.dy[2] / EPS, rtol=1e-12)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "all")
@pytest.mark.parametrize("order", [2, "fwd-rev"])
def test_the_directional_derivatives_are_torchs_float64_ones(order, path):
    """The double backward and forward-over-reverse follow from the form (λ = 1 + eps/rms and its rate): torch's
    float64 autograd, on rows whose rms is near eps as well as far above it."""
    inputs = _case((6, 3, 4), order=order, **path).make_inputs()
    x = inputs.x.copy()
    x[1] *= 1e-3 / np.sqrt(np.mean(x[1] ** 2))  # rms = eps/10
    inputs = replace(inputs, x=x)
    assert_directional_derivatives_are_torchs(inputs, _formula)


@pytest.mark.parametrize("profile", ["normal", "near_constant"])
def test_the_double_backward_is_the_derivative_of_the_first_order_reference(profile):
    """d2x, d2γ and d2dy against central differences of the first-order reference (near_constant: rows whose rms is
    about eps, without its zero rows, where the second derivative has a kink)."""
    inputs = _case((6, 5, 3), order=2, profile=profile).make_inputs()
    if profile == "near_constant":
        inputs = replace(inputs, x=inputs.x[1::2].repeat(2, axis=0))
    h = 1e-7 if profile == "near_constant" else 1e-5
    assert_double_backward_is_the_derivative_of_the_first_order(inputs, h)


def test_the_near_constant_profile_puts_rows_on_both_sides_of_eps():
    """The profile aims its data at eps for the op's statistic (eps outside the root: rms ≈ eps)."""
    inputs = Case("rmsnorm_eps_out", (64, 16), "f32", profile="near_constant", eps=EPS, normalized_dims=1).make_inputs()
    rms = np.sqrt(np.mean(inputs.x.astype(np.float64) ** 2, axis=-1))
    odd = rms[1::2]
    assert (odd < EPS).any() and (odd > EPS).any() and (rms[::2] == 0).all()


def test_torchs_nan_double_backward_in_a_zero_row_is_its_known_issue_and_a_guarded_one_passes():
    case = Case("rmsnorm_eps_out", (4, 16), "f64", profile="near_constant", eps=EPS, order=2, normalized_dims=1)
    report = compare("rmsnorm_eps_out", "torch", case)
    assert report.verdict == KNOWN and ZERO_ROW_DOUBLE_BACKWARD.key in report.message
    assert report.worst.name == "d2x" and "NaN" in report.message
    assert compare("rmsnorm_eps_out", bound("rmsnorm_eps_out", CORRECT["fused"]), case).verdict not in (FAIL, KNOWN)
