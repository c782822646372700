"""LayerNorm: the reference against torch in float64, torch's recorded issue reproduced with numbers,
and bad input as one-line errors. (Its derivative check, sweep, mutants and implementations come from
the templates in tests/test_ops.py and tests/test_impls.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from normcheck import Case, UsageError, compare
from normcheck.cases.strategies import cases
from normcheck.cases.case import takers_of
from normcheck.cli import main
from normcheck.core.text import listing
from normcheck.engine import KNOWN
from normcheck.ops import get_op
from normcheck.reference import layer_norm_backward, layer_norm_forward

LN = get_op("layernorm")


@settings(deadline=None, max_examples=60)
@given(cases("layernorm", dtypes=["f64"], profiles=["normal", "heavy_tailed", "sparse_dy"], max_numel=4000))
def test_the_reference_is_torch_in_float64(case):
    inputs = case.make_inputs()
    ours = LN.reference(inputs)
    d = tuple(case.shape[len(case.shape) - case.normalized_dims:])
    x = torch.tensor(inputs.x, requires_grad=True)
    w = None if inputs.weight is None else torch.tensor(inputs.weight, requires_grad=True)
    b = None if inputs.bias is None else torch.tensor(inputs.bias, requires_grad=True)
    y = F.layer_norm(x, d, w, b, case.eps)
    y.backward(torch.tensor(inputs.dy))
    _, mean, rstd = torch.ops.aten.native_layer_norm(x.detach(), list(d), None, None, case.eps)
    theirs = {"y": y, "mean": mean, "rstd": rstd, "dx": x.grad, "dweight": None if w is None else w.grad,
              "dbias": None if b is None else b.grad}
    assert set(ours) == {k for k, v in theirs.items() if v is not None}
    g = np.abs(inputs.dy).max() * (1 if inputs.weight is None else np.abs(inputs.weight).max())
    for name, value in ours.items():
        t = theirs[name].detach().numpy()
        # dx is a difference of terms of size rstd·|γ·dy| (it can cancel to ~0); dγ, dβ sums over rows
        scale = {"dx": ours["rstd"].max() * g, "dweight": np.abs(inputs.dy).sum(),
                 "dbias": np.abs(inputs.dy).sum()}.get(name, 0.0) + np.abs(t).max() + 1e-300
        assert np.abs(value - t).max() <= 1e-12 * scale * max(1, case.view.set_size) ** 0.5, (name, case.label)


def test_the_comparison_with_torch_can_fail():
    x, dy = np.random.default_rng(0).standard_normal((2, 3, 8)), np.random.default_rng(1).standard_normal((2, 3, 8))
    over_two_dims = layer_norm_forward(x, (3, 8)).y  # normalised over the wrong dims
    torch_y = F.layer_norm(torch.tensor(x), (8,)).numpy()
    assert np.abs(over_two_dims - torch_y).max() > 1e-3
    assert layer_norm_backward(dy, x, (8,)).dweight is None


def test_torchs_half_precision_parameter_gradients_are_a_known_issue_with_numbers():
    # 65537 rows of 4: dβ = Σ dy over the rows. Rounding the exact sum to bf16 errs by ~2e-3
    # (relative); torch's CPU kernel sums in bf16 and errs by 1e-1 or more, also with f32 parameters.
    case = Case("layernorm", (65537, 4), "bf16", "f32", normalized_dims=1)
    inputs = case.make_inputs()
    x = torch.tensor(inputs.x, dtype=torch.bfloat16, requires_grad=True)
    b = torch.tensor(inputs.bias, dtype=torch.float32, requires_grad=True)
    F.layer_norm(x, (4,), torch.tensor(inputs.weight, dtype=torch.float32), b).backward(
        torch.tensor(inputs.dy, dtype=torch.bfloat16))
    exact = inputs.dy.sum(axis=0)
    relative = np.abs(b.grad.double().numpy() - exact).max() / np.abs(exact).max()
    assert relative > 1e-2, relative
    report = compare("layernorm", "torch", case)
    assert report.verdict == KNOWN and "torch-ln-half-param-grads" in report.message


@pytest.mark.parametrize("argv, message", [
    (["--normalized-dims", "0"], "layernorm needs normalized_dims K (--normalized-dims) with 1 <= K <= 3"),
    (["--normalized-dims", "4"], "layernorm needs normalized_dims K (--normalized-dims) with 1 <= K <= 3"),
    (["--groups", "2"], f"--groups applies to {listing(takers_of('groups'))} only, not layernorm"),
])
def test_bad_layernorm_options_are_one_line_exit_2(argv, message, capsys):
    assert main(["compare", "--one-case", "--op", "layernorm", "--shape", "4,6,5", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_normalized_dims_belong_to_layernorm_only():
    with pytest.raises(UsageError, match=f"--normalized-dims applies to {listing(takers_of('normalized_dims'))} only, not batchnorm"):
        Case("batchnorm", (4, 3), normalized_dims=1)


@pytest.mark.parametrize("call, message", [
    (lambda: layer_norm_forward(np.ones((2, 3)), (4,)), r"normalized_shape \(4,\) must match the last dims"),
    (lambda: layer_norm_forward(np.ones((2, 3)), (3,), weight=np.ones(4)), r"weight must have shape \(3,\)"),
    (lambda: layer_norm_backward(np.ones((2, 4)), np.ones((2, 3)), (3,)), "dy must have the shape of x"),
])
def test_bad_reference_input_is_one_line_value_error(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)


def test_weight_and_bias_are_independently_present(capsys):
    assert main(["compare", "--one-case", "--op", "layernorm", "--shape", "6,7", "--affine", "weight", "--dtype", "f64"]) == 0
    assert "weight-only" in capsys.readouterr().out
    case = Case("layernorm", (6, 7), "f64", normalized_dims=1, affine="bias")
    inputs = case.make_inputs()
    assert inputs.weight is None and inputs.bias is not None
    report = compare("layernorm", "torch", case)
    assert report.verdict != "FAIL" and {t.name for t in report.tensors} == {"y", "dx", "dbias"}


@pytest.mark.parametrize("argv, message", [
    (["--op", "rmsnorm", "--affine", "bias"], "--affine bias: rmsnorm takes weight (choose both, weight, none)"),
    (["--op", "layernorm", "--affine", "gamma"], "--affine gamma: layernorm takes weight and bias"),
    (["--op", "layernorm", "--no-affine", "--affine", "weight"], "--no-affine and --affine weight disagree"),
])
def test_bad_affine_options_are_one_line_exit_2(argv, message, capsys):
    assert main(["compare", "--one-case", "--shape", "4,6", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
