"""ScaleNorm: its reference against torch's float64 autograd on both sides of the floor, the floor's convention
declared or hinted, and a scalar parameter's gradient summed over the whole batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from normcheck import Case, resolve_impl
from normcheck.engine import FAIL, PASS, judge
from normcheck.reference import scale_norm_backward, scale_norm_forward


def torch_scale_norm(x, weight, eps, floor):
    """The float64 textbook: the floor taken on the square (differentiable at a zero row)."""
    squares = (x * x).sum(-1, keepdim=True)
    return x * torch.rsqrt(squares.clamp(min=eps * eps) if floor else squares + eps) * weight


@pytest.mark.parametrize("floor", [True, False], ids=["floor", "sum"])
def test_the_reference_is_torchs_float64_autograd_above_and_below_the_floor(floor):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5))
    x[1] *= 1e-4  # a row whose norm is below eps: the floor holds its r
    x[3] = 0.0
    dy, weight, eps = rng.standard_normal((6, 5)), np.array([1.7]), 1e-2
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(weight, requires_grad=True)
    y = torch_scale_norm(xt, wt, eps, floor)
    dx, dweight = torch.autograd.grad(y, (xt, wt), torch.tensor(dy))
    fwd = scale_norm_forward(x, (5,), weight, eps, floor=floor)
    bwd = scale_norm_backward(dy, x, (5,), weight, eps, floor=floor)
    np.testing.assert_allclose(fwd.y, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bwd.dx, dx.numpy(), rtol=1e-12, atol=1e-9)
    assert bwd.dweight.shape == (1,)
    np.testing.assert_allclose(bwd.dweight, dweight.numpy(), rtol=1e-12)
    # the floor's row is x/eps and its dx g·dy/eps; the sum's adds eps to Σx² there
    expected = x[1] / eps if floor else x[1] / np.sqrt(x[1] @ x[1] + eps)
    np.testing.assert_allclose(fwd.y[1], 1.7 * expected, rtol=1e-12)


# near_constant data at eps = 1e-2: rows on both sides of the floor, where the two conventions differ
FLOORED = Case("scalenorm", (8, 16), "f32", profile="near_constant", eps=1e-2, normalized_dims=1)


def test_a_layer_that_adds_eps_to_the_sum_fails_with_the_hint_to_declare_it():
    layer = "tests._hint_layers:scale_norm_eps_in_sum"
    report = judge(FLOORED, resolve_impl("scalenorm", layer))
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == {"eps_at": "sum"}
    assert "--eps-at sum declared (the implementation adds eps to the sum of squares" in str(report.hint)
    assert judge(FLOORED.with_(eps_at="sum"), resolve_impl("scalenorm", layer)).verdict == PASS


def test_the_near_constant_profile_puts_rows_on_both_sides_of_the_floor():
    """The profile aims its data at eps for the op's statistic (a floored total: ‖x‖ ≈ eps), so that a backward
    that forgets the floor, or a floor forgotten altogether, has rows to fail on."""
    inputs = FLOORED.make_inputs()
    norms = np.linalg.norm(inputs.x, axis=-1)
    odd = norms[1::2]
    assert (odd < 1e-2).any() and (odd > 1e-2).any() and (norms[::2] == 0).all()
