"""The paths beyond a training-mode first-order backward: eval mode, frozen inputs, the double backward, dy left
alone and determinism. The references are checked against finite differences and torch's float64 autograd; the
engine's verdicts against implementations built to take (or break) each path."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from normcheck import Case, Impl, compare
from normcheck.cases.tokens import decode_case, encode_case
from normcheck.core.errors import UsageError
from normcheck.engine import FAIL, PASS
from normcheck.engine.expected import Grouped, arithmetic, expected_outputs, grouped
from normcheck.engine.running_error import EXACT, Tracked, tracked_arithmetic
from normcheck.ops import get_op
from normcheck.reference.setwise import SECOND_ORDER, second_order
from tests._torch_functions import SavedInputsLayerNorm, float64_tensors, functional_y, layer_norm_grads

# (op, shape, its own fields): small cases of every op with a double backward
OPS = [("batchnorm", (5, 3, 4), {}), ("groupnorm", (3, 6, 5), {"groups": 2}),
       ("layernorm", (4, 3, 6), {"normalized_dims": 2}), ("rmsnorm", (4, 7), {"normalized_dims": 1}),
       ("instancenorm", (3, 2, 9), {})]
PATHS = [dict(), dict(frozen="x"), dict(frozen="params"), dict(affine="bias"), dict(affine="weight", frozen="x")]


def _loss(case, inputs) -> float:
    """⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩ from the first-order reference."""
    first = expected_outputs(case.with_(order=1), inputs)
    pairs = (("dx", inputs.ddx), ("dweight", inputs.ddweight), ("dbias", inputs.ddbias))
    return sum(float(np.sum(first[g] * c)) for g, c in pairs if c is not None)


# every path each op takes (RMSNorm has no bias)
OP_PATHS = [(*o, p) for o in OPS for p in PATHS if p.get("affine", "weight") in get_op(o[0]).params]


@pytest.mark.parametrize("op, shape, own, path", OP_PATHS,
                         ids=[f"{o[0]}-{','.join(f'{k}={v}' for k, v in o[3].items()) or 'all'}" for o in OP_PATHS])
def test_second_order_reference_is_the_derivative_of_the_first_order_one(op, shape, own, path):
    case = Case(op, shape, "f64", profile="normal", eps=1e-3, order=2, **own, **path)
    inputs = case.make_inputs()
    ref = expected_outputs(case, inputs)
    rng = np.random.default_rng(0)
    for name, field in (("d2x", "x"), ("d2weight", "weight"), ("d2dy", "dy")):
        if name not in case.directional:
            continue
        v = rng.normal(size=getattr(inputs, field).shape)
        h = 1e-5
        up = _loss(case, replace(inputs, **{field: getattr(inputs, field) + h * v}))
        down = _loss(case, replace(inputs, **{field: getattr(inputs, field) - h * v}))
        fd = (up - down) / (2 * h)  # the directional derivative along v, central differences
        assert np.sum(ref[name] * v) == pytest.approx(fd, rel=1e-6, abs=1e-8), name


def _torch_second_order(case, inputs):
    """torch's float64 autograd, twice, on the functional op (independent of normcheck's adapter)."""
    t = float64_tensors(inputs, ("x", "dy", "weight", "bias", "running_mean", "running_var", "ddx", "ddweight",
                                 "ddbias"))
    leaves = {g: t[w].requires_grad_() for g, w in (("dx", "x"), ("dweight", "weight"), ("dbias", "bias"))
              if g in case.grads}
    dy = t["dy"].requires_grad_()
    y = functional_y(case, t)
    grads = torch.autograd.grad(y, list(leaves.values()), dy, create_graph=True)
    cot = {"dx": t["ddx"], "dweight": t["ddweight"], "dbias": t["ddbias"]}
    wrt = {"d2x": t["x"], "d2weight": t["weight"], "d2dy": dy}
    second = torch.autograd.grad(grads, [wrt[n] for n in case.directional], [cot[g] for g in leaves],
                                 allow_unused=True)
    return {n: (torch.zeros_like(wrt[n]) if s is None else s).detach().numpy() for n, s in zip(case.directional, second)}


MODES = [(*o, "train") for o in OPS] + [(*o, "eval") for o in OPS if get_op(o[0]).running_stats]


@pytest.mark.parametrize("op, shape, own, mode", MODES, ids=[f"{o[0]}-{o[3]}" for o in MODES])
def test_second_order_reference_matches_torch_float64(op, shape, own, mode):
    # (torch's double backward raises with a bias but no weight: torch-*-double-backward-bias-without-weight)
    for path in [p for p in PATHS if p.get("affine", "weight") in get_op(op).params and p.get("affine") != "bias"]:
        case = Case(op, shape, "f64", profile="normal", mode=mode, order=2, **own, **path)
        inputs = case.make_inputs()
        ref, theirs = expected_outputs(case, inputs), _torch_second_order(case, inputs)
        for name in case.directional:
            np.testing.assert_allclose(ref[name], theirs[name], rtol=1e-9, atol=1e-10, err_msg=f"{path} {name}")


@pytest.mark.parametrize("op, shape, own, mode", MODES, ids=[f"{o[0]}-{o[3]}" for o in MODES])
def test_each_directional_output_alone_and_its_bound_are_what_the_whole_second_order_gives(op, shape, own, mode):
    """The setwise formulas compute only the outputs a case compares (forward mode: y's JVP alone), and the running
    error skips the zero terms of exact inputs: neither may change a value or a bound by a bit."""
    case = Case(op, shape, "f32", profile="normal", mode=mode, order=2, **own)
    g, u = grouped(case, case.make_inputs()), 2.0**-24

    def tracked(bound_of) -> Grouped:
        def t(a):
            return Tracked(a, bound_of(a), u)
        return Grouped(t(g.x), t(g.dy), t(g.gamma), t(g.beta), g.running and tuple(map(t, g.running)),
                       t(g.ddx), t(g.ddweight), t(g.ddbias))

    def evaluate(values: Grouped, ar, wanted) -> dict:
        out = second_order(values.x, values.dy, values.gamma, values.ddx, values.ddweight, values.ddbias,
                           case.eps_value, ar, centred=case.record.centred, stats=values.running, wanted=wanted)
        return {k: (v.value, v.bound) if isinstance(v, Tracked) else (v,) for k, v in out.items()}

    running_error = tracked_arithmetic(case.view, u, 2.0)
    wholes = []
    for values, ar in ((g, arithmetic(case)), (tracked(lambda a: EXACT), running_error),
                       (tracked(np.zeros_like), running_error)):
        whole = evaluate(values, ar, SECOND_ORDER)
        assert set(whole) == set(SECOND_ORDER)
        for name in SECOND_ORDER:
            alone = evaluate(values, ar, (name,))
            assert list(alone) == [name] and all(map(np.array_equal, alone[name], whole[name])), name
        wholes.append(whole)
    _, exact_inputs, zero_bounds = wholes
    for name in SECOND_ORDER:  # (value and bound, bit for bit)
        assert all(map(np.array_equal, exact_inputs[name], zero_bounds[name])), name


@pytest.mark.parametrize("op", ["batchnorm", "instancenorm"])
def test_eval_reference_matches_torch_float64_and_keeps_the_running_statistics(op):
    case = Case(op, (3, 4, 6), "f64", profile="offset", mode="eval")
    inputs = case.make_inputs()
    ref = expected_outputs(case, inputs)
    t = {k: torch.from_numpy(getattr(inputs, k).copy()) for k in ("x", "dy", "weight", "bias", "running_mean",
                                                                   "running_var")}
    x, w, b = (t[k].requires_grad_() for k in ("x", "weight", "bias"))
    fn = F.batch_norm if op == "batchnorm" else F.instance_norm
    y = fn(x, t["running_mean"], t["running_var"], w, b, False, 0.1, case.eps)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], t["dy"])
    for name, theirs in (("y", y), ("dx", dx), ("dweight", dw), ("dbias", db)):
        np.testing.assert_allclose(ref[name], theirs.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
    assert np.array_equal(ref["running_mean"], inputs.running_mean)
    assert "mean" not in ref and "invstd" not in ref  # eval mode saves no batch statistics


def test_a_frozen_input_has_no_gradient_to_compare():
    case = Case("batchnorm", (4, 3, 5), frozen="x")
    assert case.grads == ("dweight", "dbias") and "dx" not in expected_outputs(case, case.make_inputs())
    assert Case("batchnorm", (4, 3, 5), frozen="params").grads == ("dx",)
    assert Case("batchnorm", (4, 3, 5), affine="bias", frozen="x").grads == ("dbias",)


@pytest.mark.parametrize("fields, message", [
    (dict(op="groupnorm", groups=2, mode="eval"), "--mode eval applies to the ops with running statistics"),
    (dict(op="batchnorm", mode="inference"), "unknown mode 'inference'"),
    (dict(op="batchnorm", frozen="params", affine=False), "no parameters to freeze"),
    (dict(op="batchnorm", frozen="x", affine=False), "leaves nothing that requires grad"),
    (dict(op="batchnorm", frozen="gamma"), "unknown frozen 'gamma'"),
    (dict(op="batchnorm", order=3), "order must be 1, 2, fwd or fwd-rev"),
])
def test_a_path_the_op_cannot_take_is_a_one_line_error(fields, message):
    op = fields.pop("op")
    with pytest.raises(UsageError, match=message) as e:
        Case(op, (4, 6, 5), **fields)
    assert "\n" not in str(e.value)


def test_tokens_carry_the_path_and_older_tokens_keep_theirs():
    case = Case("instancenorm", (2, 3, 5), "bf16", mode="eval", frozen="x", order=2)
    assert decode_case(encode_case(case)) == case
    plain = Case("instancenorm", (2, 3, 5), "bf16")
    assert "mode" not in encode_case(plain) and decode_case(encode_case(plain)).mode == "train"


class _OnceDifferentiable(torch.autograd.Function):
    """A correct LayerNorm whose backward is marked once differentiable."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            y = F.layer_norm(xd, xd.shape[-1:], weight.detach(), bias.detach(), eps)
        ctx.save_for_backward(x, weight, bias)
        ctx.eps = eps
        return y.detach()

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return (*layer_norm_grads(ctx, dy), None)


def once_differentiable_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _OnceDifferentiable.apply(input, weight, bias, eps)


def test_an_implementation_only_once_differentiable_is_judged_at_first_order_at_order_2_not_skipped():
    case = Case("layernorm", (4, 8), "f64", normalized_dims=1)
    assert compare("layernorm", once_differentiable_layer_norm, case).verdict == PASS
    report = compare("layernorm", once_differentiable_layer_norm, case.with_(order=2))
    assert report.verdict == PASS and report.unjudged.startswith("order 2 (only once differentiable")
    assert {t.name for t in report.tensors} == {"y", "dx", "dweight", "dbias"}


class _FromSavedStatistics(torch.autograd.Function):
    """A correct first-order LayerNorm whose backward works from the x̂ and rstd its forward saved: differentiating
    it again reaches dy and γ, never x (d2x is 0)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
        x_hat = (x - mean) * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        return x_hat * weight + bias

    @staticmethod
    def backward(ctx, dy):
        x_hat, rstd, weight = ctx.saved_tensors
        g = dy * weight
        dx = rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return dx, (dy * x_hat).sum(0), dy.sum(0), None


def from_saved_statistics_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _FromSavedStatistics.apply(input, weight, bias, eps)


def test_a_double_backward_that_never_reaches_x_says_why_and_names_the_remedy():
    case = Case("layernorm", (4, 8), "f64", normalized_dims=1)
    assert compare("layernorm", from_saved_statistics_layer_norm, case).verdict == PASS
    report = compare("layernorm", from_saved_statistics_layer_norm, case.with_(order=2))
    assert report.verdict == FAIL and report.message.startswith("d2x: ratio")
    assert "d2x is 0 everywhere: no gradient reaches x through the first-order backward" in report.message
    assert "mark it @once_differentiable" in report.message and report.tensor("d2x").all_zero


def test_a_record_that_says_it_is_once_differentiable_is_judged_at_first_order_at_order_2_with_the_reason():
    impl = Impl("mine", "layernorm", "test code", F.layer_norm, orders=(1,))
    report = compare("layernorm", impl, Case("layernorm", (4, 8), normalized_dims=1, order=2))
    assert report.verdict == PASS and "mine is only once differentiable" in report.unjudged
    assert report.judged_case.order == 1 and "dx" in {t.name for t in report.tensors}


def noisy_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Correct to well within budget, but never the same bits twice (a racing reduction's signature)."""
    y = F.layer_norm(input, normalized_shape, weight, bias, eps)
    return y + (torch.rand_like(y) * torch.finfo(y.dtype).eps * y.abs()).detach()


def test_outputs_that_differ_between_two_runs_on_identical_inputs_fail_unless_declared():
    case = Case("layernorm", (64, 32), "f64", normalized_dims=1)
    report = compare("layernorm", noisy_layer_norm, case)
    assert report.verdict == FAIL and report.message.startswith("not deterministic") and "y" in report.message
    declared = Impl("noisy", "layernorm", "test code", noisy_layer_norm, deterministic=False)
    assert compare("layernorm", declared, case).verdict == PASS


def dx_into_dy_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _DxIntoDy.apply(input, weight, bias, eps)


class _DxIntoDy(SavedInputsLayerNorm):
    @staticmethod
    def backward(ctx, dy):
        dx, dw, db = layer_norm_grads(ctx, dy)
        return dy.copy_(dx), dw, db, None  # the kernel reuses grad_output's buffer for dx


def test_a_backward_that_writes_into_dy_fails_naming_dy():
    report = compare("layernorm", dx_into_dy_layer_norm, Case("layernorm", (4, 8), normalized_dims=1))
    assert report.verdict == FAIL and report.message == "modified its input dy in place"


def test_the_double_backward_of_syncbn_is_not_judged_and_its_first_order_is():
    from normcheck import resolve_impl

    report = compare("syncbn", resolve_impl("syncbn", "torch19"), Case("syncbn", (4, 3, 5), split=(3, 1), order=2))
    assert report.verdict == PASS and "torch's SyncBatchNorm Function is only once differentiable" in report.unjudged
    assert "not judged: order 2" in report.summary() and report.judged_case.order == 1
