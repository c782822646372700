"""RMSNorm: the reference against torch in float64 (both conventions and casting chains), its
identities, eps=None as torch means it, the conventions on the command line, and bad input as
one-line errors. (Its derivative check, sweep, mutants and implementations come from the templates in
tests/test_ops.py and tests/test_impls.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from normcheck import Case, compare
from normcheck.cases.strategies import cases
from normcheck.cases.case import takers_of
from normcheck.cli import main
from normcheck.core.text import listing
from normcheck.engine import PASS, SKIP
from normcheck.numerics.dtypes import quantise
from normcheck.ops import OPS, get_op
from normcheck.reference import rms_norm_backward, rms_norm_forward

RMS = get_op("rmsnorm")


@settings(deadline=None, max_examples=60)
@given(cases("rmsnorm", dtypes=["f64", "f32", "bf16"], profiles=["normal", "heavy_tailed", "near_constant"],
             max_numel=4000))
def test_the_reference_is_torch_in_float64(case):
    """torch float64 autograd of the layer as each convention defines it, on the case's (quantised) inputs."""
    inputs = case.make_inputs()
    ours = RMS.reference(inputs)
    d = tuple(case.shape[len(case.shape) - case.normalized_dims:])
    x = torch.tensor(inputs.x, requires_grad=True)
    w = None if inputs.weight is None else torch.tensor(inputs.weight, requires_grad=True)
    xhat = F.rms_norm(x, d, None, case.eps_value)
    if case.casting == "before-weight":  # rounded to the input dtype, gradient passed straight through
        rounded = torch.tensor(quantise(xhat.detach().numpy(), case.dtype))
        xhat = xhat + (rounded - xhat).detach()
    if case.casting == "rstd-input":  # rstd rounded, then x · rstd rounded, both straight through
        r = torch.rsqrt(x.detach().pow(2).mean(dim=tuple(range(-len(d), 0)), keepdim=True) + case.eps_value)
        rounded = torch.tensor(quantise((x.detach() * torch.tensor(quantise(r.numpy(), case.dtype))).numpy(),
                                        case.dtype))
        xhat = xhat + (rounded - xhat).detach()
    y = xhat if w is None else xhat * (w + case.weight_offset)
    y.backward(torch.tensor(inputs.dy))
    theirs = {"y": y, "dx": x.grad, "dweight": None if w is None else w.grad,
              "rstd": torch.rsqrt(x.detach().pow(2).mean(dim=tuple(range(-len(d), 0)), keepdim=True) + case.eps_value)}
    assert set(ours) == {k for k, v in theirs.items() if v is not None}
    g = np.abs(inputs.dy).max() * (1 if inputs.weight is None else np.abs(inputs.weight).max() + case.weight_offset)
    for name, value in ours.items():
        t = theirs[name].detach().numpy()
        scale = {"dx": ours["rstd"].max() * g, "dweight": np.abs(inputs.dy).sum()}.get(name, 0.0) + np.abs(t).max()
        assert np.abs(value - t).max() <= 1e-12 * (scale + 1e-300) * max(1, case.view.set_size) ** 0.5, (name, case.label)


def test_without_eps_the_layer_is_scale_invariant():
    """y(αx) = y(x) when eps = 0, so the gradient is orthogonal to x in every row: Σ x·dx = 0."""
    rng = np.random.default_rng(0)
    x, dy, w = rng.standard_normal((5, 3, 7)), rng.standard_normal((5, 3, 7)), rng.standard_normal((3, 7))
    dx = rms_norm_backward(dy, x, (3, 7), w, eps=0.0, offset=1.0).dx
    assert np.abs((x * dx).sum(axis=(1, 2))).max() < 1e-12
    with_eps = rms_norm_backward(dy, x, (3, 7), w, eps=0.5, offset=1.0).dx  # and the check can fail
    assert np.abs((x * with_eps).sum(axis=(1, 2))).max() > 1e-3


def test_the_conventions_change_the_reference():
    rng = np.random.default_rng(1)
    x, dy, w = rng.standard_normal((64, 8)), rng.standard_normal((64, 8)), rng.uniform(-0.1, 0.1, 8)
    plain, gemma = rms_norm_forward(x, (8,), w), rms_norm_forward(x, (8,), w, offset=1.0)
    assert np.abs(gemma.y - plain.y - plain.y / w).max() < 1e-12  # (w + 1)·x̂ = w·x̂ + x̂
    to_bf16 = (lambda a, x, rstd: quantise(a, "bf16"))  # (the rounding sees x̂, and x and rstd for rstd-input)
    rounded = rms_norm_backward(dy, x, (8,), w, rounding=to_bf16)
    exact = rms_norm_backward(dy, x, (8,), w)
    assert np.array_equal(rounded.dx, exact.dx)  # the cast is passed straight through
    assert 1e-4 < np.abs(rounded.dweight - exact.dweight).max() / np.abs(exact.dweight).max() < 1e-2


def test_eps_none_is_the_float32_epsilon_for_half_input_as_in_torch():
    # torch's kernels take finfo of the precision they compute in (pytorch#142848), not of the input
    # dtype (what their docs said until 2026): rows of mean square ≈ 1e-4 tell 1.2e-7 from bf16's 7.8e-3.
    case = Case("rmsnorm", (64, 32), "bf16", profile="near_constant", normalized_dims=1, eps=None)
    assert case.eps_value == float(np.finfo(np.float32).eps) and "eps=None" in case.label
    x = torch.tensor(case.make_inputs().x, dtype=torch.bfloat16)
    as_float32 = F.rms_norm(x.double(), (32,), eps=float(np.finfo(np.float32).eps))
    assert torch.allclose(F.rms_norm(x, (32,)).double(), as_float32, rtol=1e-2, atol=0)
    assert compare("rmsnorm", "torch", case).verdict == PASS


def test_torch_skips_a_convention_it_does_not_follow_and_the_mutant_record_runs_under_its_own(capsys):
    report = compare("rmsnorm", "torch", Case("rmsnorm", (4, 6), normalized_dims=1, weight_offset=1.0))
    assert report.verdict == SKIP and "torch follows weight_offset=0.0 (the case has 1.0)" in report.message
    assert main(["compare", "--op", "rmsnorm", "--impl", "tests.mutants.rmsnorm:forgets_offset", "--maxfail", "1"]) == 1
    failing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and " w+1 " in failing[0]


def test_a_users_convention_is_given_on_the_command_line(capsys):
    args = ["compare", "--one-case", "--op", "rmsnorm", "--shape", "8,16", "--dtype", "mixed-bf16", "--impl"]
    assert main([*args, "tests.mutants.rmsnorm:textbook"]) == 0
    assert main([*args, "tests.mutants.rmsnorm:textbook", "--weight-offset", "1"]) == 1  # it scales by w alone
    assert main([*args, "tests.mutants.rmsnorm:gemma", "--weight-offset", "1"]) == 0
    assert " w+1 " in capsys.readouterr().out
    assert main([*args, "tests.mutants.rmsnorm:gemma", "--casting", "before-weight"]) == 2
    assert "--casting before-weight: gemma follows casting=end" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--op", "layernorm", "--weight-offset", "1"], f"--weight-offset applies to {listing(takers_of('weight_offset'))} only, not layernorm"),
    (["--op", "groupnorm", "--casting", "end"], f"--casting applies to {listing(takers_of('casting'))} only, not groupnorm"),
    (["--op", "rmsnorm", "--casting", "late"], "unknown casting 'late'; choose one of end, before-weight, rstd-input"),
    (["--op", "rmsnorm", "--weight-offset", "inf"], "the weight offset must be a finite number"),
    (["--op", "layernorm", "--eps", "none"], f"layernorm needs a number for eps (eps=None is for {listing(o.name for o in OPS.values() if o.eps_none)} only)"),
    (["--op", "rmsnorm", "--eps", "tiny"], "'tiny' is not a number or none"),
    (["--op", "rmsnorm", "--normalized-dims", "4"], "rmsnorm needs normalized_dims K (--normalized-dims) with 1 <= K <= 3"),
])
def test_bad_rmsnorm_options_are_one_line_exit_2(argv, message, capsys):
    assert main(["compare", "--one-case", "--shape", "4,6,5", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("call, message", [
    (lambda: rms_norm_forward(np.ones((2, 3)), (4,)), r"normalized_shape \(4,\) must match the last dims"),
    (lambda: rms_norm_forward(np.ones((2, 3)), (3,), weight=np.ones(4)), r"weight must have shape \(3,\)"),
    (lambda: rms_norm_backward(np.ones((2, 4)), np.ones((2, 3)), (3,)), "dy must have the shape of x"),
    (lambda: rms_norm_forward(np.ones((2, 3)), (3,), eps=-1.0), "eps must be >= 0"),
])
def test_bad_reference_input_is_one_line_value_error(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)
