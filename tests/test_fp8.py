"""fp8 output (Case.fp8, LayerNorm and RMSNorm): the reference against torch's own cast, the scale a case draws, the
contract the torch adapter holds an implementation to, the budget's rounding spread, and the field as the front
ends take it. (The fp8 sweeps of torch's records and of the catalogue's correct and mutant ones come from the
templates in tests/test_impls.py and tests/test_ops.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normcheck import Case, compare
from normcheck.cases.sweep import default_sweep
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.core.loading import check_arity
from normcheck.engine import FAIL, PASS, SKIP
from normcheck.numerics.dtypes import FP8_FORMATS, FP8_MAX, quantise
from normcheck.ops import get_op
from normcheck.ops.fused import reference_of
from normcheck.engine.stage_bounds import rounding_spread

TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OPS = ("layernorm", "rmsnorm")


def test_torchs_e4m3fn_cast_saturates_and_e5m2_overflows():
    """What quantise mirrors (bit for bit: tests/meta/test_quantise.py): torch 2.13's CPU cast to float8_e4m3fn
    saturates at ±448 (inf included), to float8_e5m2 past 61440 gives ±inf."""
    values = np.array([500.0, -1e4, np.inf, 61439.0, 61440.0])
    assert quantise(values, "e4m3").tolist() == [448.0, -448.0, 448.0, 448.0, 448.0]
    assert quantise(values, "e5m2").tolist() == [512.0, -10240.0, np.inf, 57344.0, np.inf]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_the_reference_is_torchs_cast_of_the_float64_y(op, fmt):
    case = Case(op, (5, 3, 40), "bf16", normalized_dims=2, fp8=fmt, profile="heavy_tailed")
    inputs = case.make_inputs()
    ref = reference_of(case)(inputs)  # (the record's reference with the cast stage fp8 adds)
    scale = float(inputs.extra["scale"])
    limit = torch.finfo(TORCH_FP8[fmt]).max
    theirs = (torch.tensor(ref["y"]) * scale).clamp(-limit, limit).to(TORCH_FP8[fmt]).double().numpy()
    assert np.array_equal(ref["y_fp8"], theirs)
    assert ref["amax"].shape == () and ref["amax"] == np.abs(ref["y"]).max()


@pytest.mark.parametrize("op", OPS)
def test_the_scale_is_a_power_of_two_at_which_ys_largest_values_saturate(op):
    saturating = []
    for case in default_sweep(op, follows=(("fp8", "e4m3"),))[:40]:
        inputs = case.make_inputs()
        y, scale = get_op(op).reference(inputs)["y"], float(inputs.extra["scale"])
        assert inputs.extra["scale"].shape == () and np.log2(scale) == np.round(np.log2(scale))
        if np.abs(y).max() > 0:
            assert FP8_MAX["e4m3"] <= np.abs(y).max() * scale < 2 * FP8_MAX["e4m3"]
            saturating.append(np.mean(np.abs(y) * scale >= FP8_MAX["e4m3"]))
    assert 0 < np.median(saturating) < 0.5


def test_without_fp8_a_case_is_what_it_was():
    """No scale, no fp8 results, the same data as the case's fp8 twin: the field adds only its own tensors."""
    plain, fp8 = Case("layernorm", (4, 9), normalized_dims=1), Case("layernorm", (4, 9), normalized_dims=1, fp8="e5m2")
    record = get_op("layernorm")
    assert plain.make_inputs().extra == {} and record.results_of(plain) == record.results == ()
    assert [r.name for r in record.results_of(fp8)] == ["y_fp8", "amax"]
    assert np.array_equal(plain.make_inputs().x, fp8.make_inputs().x) and plain.label == "4x9 D=1 f32 contiguous normal"
    assert fp8.label == "4x9 D=1 fp8=e5m2 f32 contiguous normal"


def test_the_contract_passes_a_float32_scale_and_the_fp8_dtype_and_dy_in_the_case_dtype():
    seen = {}

    def layer_norm_fp8(input, normalized_shape, weight, bias, eps, *, scale, fp8_dtype):
        seen.update(scale=(scale.dtype, tuple(scale.shape)), fp8_dtype=fp8_dtype)
        y = F.layer_norm(input, normalized_shape, weight, bias, eps)
        y.register_hook(lambda dy: seen.update(dy=dy.dtype))
        limit = torch.finfo(fp8_dtype).max
        return y, (y.detach().float() * scale).clamp(-limit, limit).to(fp8_dtype), y.detach().abs().amax().float()

    case = Case("layernorm", (6, 33), "bf16", normalized_dims=1, fp8="e4m3")
    assert compare("layernorm", layer_norm_fp8, case).verdict in (PASS, "KNOWN")
    assert seen == {"scale": (torch.float32, ()), "fp8_dtype": torch.float8_e4m3fn, "dy": torch.bfloat16}


@pytest.mark.parametrize("returned, message", [
    (lambda y, q, a: y, "returned Tensor, expected (y, y_fp8, amax)"),
    (lambda y, q, a: (y, q.float(), a), "y_fp8 has dtype f32, expected e4m3"),
    (lambda y, q, a: (y, q, a.reshape(1)), "amax has shape (1,), expected ()"),
])
def test_the_interface_is_checked(returned, message):
    def fn(input, normalized_shape, weight, eps, *, scale, fp8_dtype):
        y = F.rms_norm(input, normalized_shape, weight, eps)
        limit = torch.finfo(fp8_dtype).max
        return returned(y, (y.detach() * scale).clamp(-limit, limit).to(fp8_dtype), y.detach().abs().amax())

    report = compare("rmsnorm", fn, Case("rmsnorm", (4, 9), normalized_dims=1, fp8="e4m3"))
    assert report.verdict == FAIL and message in report.message


def test_torchs_fp8_record_has_torchs_gradients():
    case = Case("rmsnorm", (7, 129), "f16", normalized_dims=1, fp8="e5m2", profile="offset")
    fp8, plain = compare("rmsnorm", "torch-fp8-e5m2", case), compare("rmsnorm", "torch", case.with_(fp8=None))
    assert fp8.verdict == PASS and plain.verdict == PASS
    assert {t.name: t.max_ratio for t in plain.tensors} == {t.name: t.max_ratio for t in fp8.tensors
                                                          if t.name not in ("y_fp8", "amax")}
    assert compare("rmsnorm", "torch", case).verdict == SKIP  # (F.rms_norm returns y only: it follows fp8=None)


def test_the_rounding_spread_is_one_ulp_where_the_interval_holds_a_midpoint():
    values = np.array([124.0, 123.99, 110.0, 127.9, 447.0, 460.0])
    error = np.array([0.5, 0.5, 0.5, 0.5, 20.0, 20.0])
    # 124: the midpoint below 128, whose own ulp is 16 (the binade below it counts); 110 and 127.9: nowhere near one;
    # 447 ± 20 reaches 432, the midpoint below the largest value; 460 saturates either way
    assert rounding_spread(values, error, "e4m3").tolist() == [8.0, 8.0, 0.0, 0.0, 32.0, 0.0]


def test_a_one_ulp_error_away_from_a_midpoint_fails():
    def off_by_one_ulp(input, normalized_shape, weight, bias, eps, *, scale, fp8_dtype):
        y = F.layer_norm(input, normalized_shape, weight, bias, eps)
        q = (y.detach().float() * scale).clamp(-448, 448).to(fp8_dtype)
        bumped = q.view(torch.uint8).clone()
        bumped[0, 0] -= 1  # one ulp toward zero (a positive value) or away from it (a negative one)
        return y, bumped.view(fp8_dtype), y.detach().abs().amax().float()

    report = compare("layernorm", off_by_one_ulp, Case("layernorm", (4, 9), normalized_dims=1, fp8="e4m3"))
    assert report.verdict == FAIL and report.worst.name == "y_fp8" and report.worst.worst_index == (0, 0)


def test_the_array_contract_refuses_fp8():
    with pytest.raises(UsageError, match="array contract .* has no fp8 output yet"):
        get_op("layernorm").array_call(None, None, Case("layernorm", (4, 9), normalized_dims=1, fp8="e4m3"))


@pytest.mark.parametrize("argv, message", [
    (["--op", "groupnorm", "--groups", "2", "--fp8", "e4m3"], "--fp8 applies to layernorm and rmsnorm only, not groupnorm"),
    (["--op", "add_layernorm", "--fp8", "e4m3", "--impl", "torch"],
     "--fp8 applies to layernorm and rmsnorm only, not add_layernorm"),
    (["--op", "layernorm", "--fp8", "e4m3"], "--fp8 e4m3: torch follows fp8=None"),
    (["--op", "rmsnorm", "--fp8", "e4m3", "--impl", "torch-fp8-e5m2"], "--fp8 e4m3: torch-fp8-e5m2 follows fp8=e5m2"),
    (["--op", "rmsnorm", "--fp8", "e8m0"], "argument --fp8: unknown fp8 'e8m0'; choose one of e4m3, e5m2"),
])
def test_bad_fp8_options_are_one_line_exit_2(argv, message, capsys):
    assert main(["compare", "--one-case", "--shape", "4,6", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_unknown_format_in_a_case_is_one_line():
    with pytest.raises(UsageError, match="unknown fp8 'e3m4'; choose one of e4m3, e5m2"):
        Case("rmsnorm", (4, 6), normalized_dims=1, fp8="e3m4")


def test_the_plugin_takes_the_field_as_a_convention(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "layernorm", "--normcheck-impl",
                                          "torch-fp8-e5m2", "--normcheck-fp8", "e5m2")
    sweep = [line for line in result.outlines if "::test_default_sweep[" in line]
    assert result.ret == 0 and len(sweep) == len(default_sweep("layernorm")) and all(" fp8=e5m2 " in s for s in sweep)
    refused = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "layernorm", "--normcheck-fp8", "e4m3")
    assert refused.ret != 0 and "--normcheck-fp8 e4m3: torch follows fp8=None" in "\n".join(refused.errlines)


def test_a_function_may_require_the_fp8_keywords_and_no_others():
    """check_arity: the keywords a later form of the contract names (`with --fp8: fn(..., scale=..., fp8_dtype=...)`)
    may be required keyword-only parameters; any other still may not."""
    signature = get_op("rmsnorm").signature
    check_arity("fp8_rms_norm", lambda input, normalized_shape, weight, eps, *, scale, fp8_dtype: None, signature)
    with pytest.raises(UsageError, match="requires a keyword block the contract does not pass"):
        check_arity("blocked", lambda input, normalized_shape, weight, eps, *, block: None, signature)
