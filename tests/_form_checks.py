"""What the statistic-form ops' tests (tests/test_layernorm_std.py, test_rmsnorm_eps_out.py, test_simplenorm.py) check their
float64 references with: torch's float64 autograd of the op's formula (double backward, forward-over-reverse) and
central differences of the first-order reference. `formula(t)`: y from the dict of tensors `tensors` makes."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD

from normcheck.engine.expected import expected_outputs

WRT = {"dx": "x", "dweight": "weight", "dbias": "bias"}  # gradient -> the input it is taken of
TANGENT = {"x": "ddx", "weight": "ddweight", "bias": "ddbias"}  # input -> its direction


def tensors(inputs) -> dict:
    """The case's arrays as float64 tensors (None where it has none); the inputs its gradients are of require grad."""
    t = {k: None if getattr(inputs, k) is None else torch.tensor(getattr(inputs, k))
         for k in ("x", "dy", "weight", "bias", "ddx", "ddweight", "ddbias")}
    for g in inputs.case.grads:
        t[WRT[g]].requires_grad_()
    return t


def second_order(case, inputs, formula) -> dict:
    """torch's float64 double backward of `formula`: the gradient of ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩."""
    t = tensors(inputs)
    dy = t["dy"].requires_grad_()
    grads = torch.autograd.grad(formula(t), [t[WRT[g]] for g in case.grads], dy, create_graph=True)
    of = {"d2x": t["x"], "d2weight": t["weight"], "d2dy": dy}
    second = torch.autograd.grad(grads, [of[n] for n in case.directional], [t[TANGENT[WRT[g]]] for g in case.grads],
                                 allow_unused=True)
    return {n: (torch.zeros_like(of[n]) if s is None else s).detach().numpy() for n, s in zip(case.directional, second)}


def forward_over_reverse(case, inputs, formula) -> dict:
    """torch's float64 forward-mode AD of y and of its backward (forward-over-reverse)."""
    t = tensors(inputs)
    with fwAD.dual_level():
        for g in case.differentiated:
            t[WRT[g]] = fwAD.make_dual(t[WRT[g]], t[TANGENT[WRT[g]]])
        y = formula(t)
        grads = dict(zip(case.grads, torch.autograd.grad(y, [t[WRT[g]] for g in case.grads], t["dy"],
                                                         create_graph=True)))
        primals = {"y": y, **grads}
        return {name: fwAD.unpack_dual(primals[p]).tangent.detach().numpy() for name, p in case.tangents.items()}


def assert_directional_derivatives_are_torchs(inputs, formula) -> None:
    """The reference's double backward (order 2) or forward-over-reverse (fwd-rev) of the case of `inputs`: torch's
    float64 autograd of `formula`."""
    case = inputs.case
    ref = expected_outputs(case, inputs)
    theirs = (second_order if case.order == 2 else forward_over_reverse)(case, inputs, formula)
    assert theirs
    for name, value in theirs.items():
        np.testing.assert_allclose(ref[name], value, rtol=1e-9, atol=1e-9, err_msg=name)


def first_order_loss(case, inputs) -> float:
    """⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩ from the first-order reference."""
    first = expected_outputs(case.with_(order=1), inputs)
    pairs = (("dx", inputs.ddx), ("dweight", inputs.ddweight), ("dbias", inputs.ddbias))
    return sum(float(np.sum(first[g] * c)) for g, c in pairs if c is not None)


def assert_double_backward_is_the_derivative_of_the_first_order(inputs, h: float) -> None:
    """d2x, d2γ and d2dy of the reference against central differences (step `h`) of its first-order loss."""
    case = inputs.case
    ref = expected_outputs(case, inputs)
    rng = np.random.default_rng(0)
    for name, field in (("d2x", "x"), ("d2weight", "weight"), ("d2dy", "dy")):
        v = rng.normal(size=getattr(inputs, field).shape)
        up = first_order_loss(case, replace(inputs, **{field: getattr(inputs, field) + h * v}))
        down = first_order_loss(case, replace(inputs, **{field: getattr(inputs, field) - h * v}))
        assert np.sum(ref[name] * v) == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-6), name
