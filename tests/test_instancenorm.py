"""InstanceNorm: the reference against torch in float64 (y, gradients and the batch-averaged running
statistics), torch's recorded issue of a batch of one measured, and bad input as one-line errors. (Its
derivative check, sweep, mutants and implementations come from the templates in tests/test_ops.py and
tests/test_impls.py; its known issues are reproduced in tests/test_known_issues.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from normcheck.cases.strategies import cases
from normcheck.cases.case import takers_of
from normcheck.cli import main
from normcheck.core.text import listing
from normcheck.ops import get_op
from normcheck.reference import instance_norm_backward, instance_norm_forward

IN = get_op("instancenorm")


@settings(deadline=None, max_examples=60)
@given(cases("instancenorm", dtypes=["f64"], profiles=["normal", "heavy_tailed", "sparse_dy"], ranks=(3, 4, 5),
             max_numel=4000))
def test_the_reference_is_torch_in_float64(case):
    inputs = case.make_inputs()
    ours = IN.reference(inputs)
    x = torch.tensor(inputs.x, requires_grad=True)  # contiguous: torch-in-batch-of-one-channels-last-dy aside
    w = None if inputs.weight is None else torch.tensor(inputs.weight, requires_grad=True)
    b = None if inputs.bias is None else torch.tensor(inputs.bias, requires_grad=True)
    rm, rv = torch.tensor(inputs.running_mean), torch.tensor(inputs.running_var)
    y = F.instance_norm(x, rm, rv, w, b, True, case.momentum, case.eps)
    y.backward(torch.tensor(inputs.dy))
    theirs = {"y": y, "dx": x.grad, "dweight": None if w is None else w.grad, "dbias": None if b is None else b.grad,
              "running_mean": rm, "running_var": rv}
    assert set(ours) == {k for k, v in theirs.items() if v is not None}
    for name, value in ours.items():
        t = theirs[name].detach().numpy()
        scale = np.abs(t).max() + np.abs(inputs.dy).sum() * (name in ("dx", "dweight", "dbias")) * 10
        assert np.abs(value - t).max() <= 1e-11 * (scale + 1e-300), (name, case.label)


def test_running_statistics_are_the_batch_average_of_unbiased_instance_statistics():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 5)) * np.array([1.0, 3.0])[None, :, None] + rng.standard_normal((3, 1, 1))
    fwd = instance_norm_forward(x, running_mean=np.zeros(2), running_var=np.zeros(2), momentum=1.0)
    assert np.allclose(fwd.running_mean, x.mean(axis=2).mean(axis=0))
    assert np.allclose(fwd.running_var, x.var(axis=2, ddof=1).mean(axis=0))
    # not the variance pooled over the batch, which adds the spread of the instance means
    assert not np.allclose(fwd.running_var, x.transpose(1, 0, 2).reshape(2, -1).var(axis=1, ddof=1))
    assert instance_norm_forward(x).running_mean is None


@pytest.mark.parametrize("argv, message", [
    (["--shape", "4,6"], "instancenorm takes 3-D, 4-D, 5-D input, not the 2-D shape 4x6"),
    (["--shape", "4,6,1"], "gives 1 values per channel; instancenorm needs at least 2"),
    (["--shape", "4,6,5", "--normalized-dims", "1"], f"--normalized-dims applies to {listing(takers_of('normalized_dims'))} only"),
])
def test_bad_instancenorm_options_are_one_line_exit_2(argv, message, capsys):
    assert main(["compare", "--op", "instancenorm", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("call, message", [
    (lambda: instance_norm_forward(np.ones((2, 3))), "x must have spatial dims with at least 2 values"),
    (lambda: instance_norm_forward(np.ones((2, 3, 4)), running_mean=np.zeros(3)), "give both running_mean and"),
    (lambda: instance_norm_forward(np.ones((2, 3, 4)), weight=np.ones(2)), r"weight must have shape \(3,\)"),
    (lambda: instance_norm_backward(np.ones((2, 3, 5)), np.ones((2, 3, 4))), "dy must have the shape of x"),
])
def test_bad_reference_input_is_one_line_value_error(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)
