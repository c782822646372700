"""Meta-tests of the tolerance model: the ratio arithmetic, and the bound's behaviour."""
from dataclasses import replace

import numpy as np
import pytest

from normcheck import Case, compare, resolve_impl
from normcheck.engine import FAIL, KNOWN, PASS, judge
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.cases.case import FROZEN
from normcheck.core.errors import UsageError
from normcheck.engine.baseline import baseline_outputs
from normcheck.engine.expected import expected_outputs
from normcheck.engine.error_terms import independent_errors_sum
from normcheck.ops import OPS, RECORDED_WITH_TORCH, get_op
from normcheck.engine.stage_bounds import inner_case
from normcheck.engine.tolerance import CONSTANTS, Constants, allowance, budget_ratio, element_bounds

FORMULA_ONLY = Constants(CONSTANTS.growth, CONSTANTS.rounding, baseline_factor=0.0)


def test_ratio_arithmetic():
    ref = np.array([1.0, 2.0, np.inf, np.nan, 1.0, 0.0])
    got = np.array([1.5, 2.0, np.inf, np.nan, np.nan, 0.0])
    bound = np.full(6, 1.0)
    r = budget_ratio(got, ref, bound, None, "f64")
    assert r[0] == pytest.approx(0.5) and r[1] == 0 and r[2] == 0 and r[3] == 0 and r[5] == 0
    assert np.isinf(r[4])  # NaN where the reference is finite
    # a singular element's bound is NaN as its reference is: NaN there is still an exact match, anything else is not
    r = budget_ratio(np.array([np.nan, 1.0, 2.0]), np.array([np.nan, np.nan, 2.0]), np.full(3, np.nan), None, "f64")
    assert r[0] == 0 and r[2] == 0 and not r[1] <= 1


def test_a_set_of_one_value_at_eps_0_is_nan_in_the_reference_and_in_torch_and_passes():
    """x̂ = 0/0 on a set of one value without eps: torch's F.layer_norm and the reference agree on NaN, and the bound of
    an element whose reference is NaN is NaN too; 0/NaN was a NaN ratio, a FAIL of torch's own record (and of ViTDet's
    channels-first LayerNorm on its rows of one channel, declared channels-first)."""
    for case in (Case("layernorm", (6, 1), eps=0.0), Case("layernorm", (6, 1), "f64", eps=0.0, order=2)):
        report = judge(case, resolve_impl("layernorm", "torch"))
        assert report.verdict == PASS, report.summary()


def test_overflow_to_inf_is_the_correct_rounding():
    ref = np.array([1e6, -1e6, 1e6])
    got = np.array([np.inf, -np.inf, -np.inf])
    r = budget_ratio(got, ref, np.ones(3), None, "f16")
    assert r[0] == 0 and r[1] == 0 and np.isinf(r[2])
    # at the edge of the range: f16's largest value is 65504 and halfway to the next binade's 65536 rounds to inf
    # (an allowance of 0.5 keeps 65519 short of 65520: inf there would need a larger error; see the test below)
    edge = np.array([65504.0, 65519.0, 65520.0, -65520.0])
    r = budget_ratio(np.full(4, np.inf) * np.sign(edge), edge, np.full(4, 0.5), None, "f16")
    assert np.isinf(r[0]) and np.isinf(r[1]) and r[2] == 0 and r[3] == 0
    bf16_max = (2 - 2.0**-7) * 2.0**127
    edge = np.array([bf16_max, bf16_max * (1 + 2.0**-8)])
    r = budget_ratio(np.array([np.inf, np.inf]), edge, np.ones(2), None, "bf16")
    assert np.isinf(r[0]) and r[1] == 0


def test_inf_is_right_where_the_final_rounding_of_a_value_within_the_allowance_overflows():
    """A kernel computing in f32 rounds its output to f16 last: where the reference lies within that rounding's reach
    (c·u_o·|ref|, no more than the allowance) of f16's overflow threshold 65520, a value within its allowance may lie
    beyond it and be stored as inf (Llama's RMSNorm: d2x 65528.1 in f32 for 65512.1). Further from the threshold no
    allowance makes inf right: only an overflow inside the computation gets there (torch's f16 BatchNorm backward: dγ
    inf for 919.2, allowed 5.1e5 there by the cancellation of offset data)."""
    ref = np.array([65512.11811, -65512.11811, 65512.11811, 65400.0, 919.1675071, 65519.0, 65519.0])
    allowed = np.array([44605.8, 44605.8, 4.0, 44605.8, 511673.6, 0.5, 1.0])
    got = np.array([np.inf, -np.inf, np.inf, np.inf, np.inf, np.inf, np.inf])
    r = budget_ratio(got, ref, allowed, None, "f16")
    assert r[0] == 0 and r[1] == 0  # (within 7.9 of 65520, which c·u_o·|ref| = 96 covers)
    assert np.isinf(r[2])  # (an allowance of 4 does not reach 65520)
    assert np.isinf(r[3])  # (120 from the threshold: more than the final rounding's 95.8)
    assert np.isinf(r[4])  # (the allowance reaches 65520, the final rounding does not)
    assert np.isinf(r[5]) and r[6] == 0
    assert np.isinf(budget_ratio(np.array([-np.inf]), ref[:1], allowed[:1], None, "f16")[0])  # (the wrong sign)
    assert budget_ratio(np.array([65504.0]), ref[:1], allowed[:1], None, "f16")[0] < 1e-3  # (the finite answer too)
    # fp8 outputs saturate (their stage clamps before it rounds): ±inf is never right for a finite reference there
    assert np.isinf(budget_ratio(np.array([np.inf]), np.array([57344.0]), np.array([1e4]), None, "e5m2")[0])


LLAMA_ORDER2_NEAR_F16_MAX = (
    "v3.eyJvcCI6InJtc25vcm0iLCJzaGFwZSI6WzEsMjU3LDEwMjVdLCJkdHlwZSI6ImYxNiIsInBhcmFtX2R0eXBlIjoiZjMyIiwieF9mb3JtYXQiOiJj"
    "b250aWd1b3VzX3NpemUxIiwiZHlfZm9ybWF0IjoiY29udGlndW91c19zaXplMSIsInByb2ZpbGUiOiJ0aW55IiwiZXBzIjowLjAsIm1vbWVudHVtIjow"
    "LjEsImFmZmluZSI6dHJ1ZSwic2VlZCI6MCwiZ2FtbWFfc2NhbGUiOjEuMCwiZnJvemVuIjoicGFyYW1zIiwib3JkZXIiOjIsIm91dHB1dF9kdHlwZSI6"
    "InByb21vdGUiLCJjb21wdXRlX2R0eXBlIjoiZjMyIiwibm9ybWFsaXplZF9kaW1zIjoxLCJ3ZWlnaHRfb2Zmc2V0IjowLjAsImNhc3RpbmciOiJiZWZv"
    "cmUtd2VpZ2h0In0.ba48737a")


def test_a_llama_rmsnorm_whose_f32_d2x_rounds_to_inf_in_f16_is_not_failed():
    """transformers' LlamaRMSNorm's one FAIL of its declared sweep (issue 62), in a layer written as it is: d2x at
    [0, 119, 1011] is 65512.118 exactly (65504 in f16), 65528.098 in the layer's f32 (x̂ and its gradient rounded to
    f16 on the way, as the before-weight chain declares; the same in float64 with those two roundings), which the
    final cast to f16 stores as inf. A mutant summing the squares in f16 still fails, its d2x inf where the reference
    is 17,699."""
    from normcheck.cases.tokens import decode_case
    from tests.mutants.rmsnorm import Bugs, _impl
    case = decode_case(LLAMA_ORDER2_NEAR_F16_MAX)
    report = compare("rmsnorm", "tests._layer_classes:LlamaStyleRMSNorm", case)
    assert report.verdict in (PASS, "MISTRUSTED"), report.summary()
    assert report.tensor("d2x").nonfinite_mismatches == 0
    half_squares = _impl("half_squares", Bugs(before_weight=True, low_precision_squares=True), "mutant")
    mutant = compare("rmsnorm", half_squares, replace(case, output_dtype="input"))
    d2x = mutant.tensor("d2x")
    assert mutant.verdict == FAIL and d2x.verdict == FAIL and np.isinf(d2x.max_ratio) and d2x.nonfinite_mismatches


@pytest.mark.skipif(not __import__("torch").__version__.startswith(RECORDED_WITH_TORCH),
                    reason=f"torch's known issues were recorded with torch {RECORDED_WITH_TORCH}")
def test_torchs_f16_batch_norm_overflow_stays_a_failure_where_its_allowance_reaches_the_threshold():
    """torch-bn-f16-intermediates: dγ comes back inf for 919.2, whose allowance (5.1e5, offset data) reaches past
    65520; counting ±inf right wherever the allowance reaches the threshold called the row MISTRUSTED."""
    case = Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset")
    report = compare("batchnorm", "torch", case)
    dweight = report.tensor("dweight")
    assert report.verdict == KNOWN and dweight.verdict == FAIL and np.isinf(dweight.got), report.summary()


def test_baseline_allowance_only_widens_and_never_from_a_nan_baseline():
    ref, got = np.array([1.0, 1.0]), np.array([1.1, 1.1])
    tight = budget_ratio(got, ref, np.array([0.01, 0.01]), None, "f64")
    widened = budget_ratio(got, ref, np.array([0.01, 0.01]), np.array([1.05, np.nan]), "f64")
    assert widened[0] < 1 < tight[0] and widened[1] == tight[1]
    bound = np.array([0.01, 0.0])
    assert allowance(ref, bound, ref) is bound  # (the reference as its own baseline: B, without comparing them)
    assert np.array_equal(allowance(ref, bound, ref.copy()), bound)  # (what comparing them gives)


@pytest.mark.parametrize("op", ["batchnorm", "groupnorm"])
def test_bounds_are_positive_finite_and_shaped_like_outputs(op):
    for case in default_sweep(op)[::7]:
        inputs = case.make_inputs()
        bounds, expected = element_bounds(case, inputs), expected_outputs(case, inputs)
        assert bounds["y"].shape == bounds["dx"].shape == case.shape
        assert bounds["dweight"].shape == (case.channels,)
        for name, b in bounds.items():
            # Zero only where the output is exactly zero whatever the rounding (e.g. dy = 0 in a whole set),
            # and for the running statistics in eval mode, which must come back unchanged.
            unchanged = name.startswith("running_") and not case.training
            if name not in expected:
                continue  # (an output the case does not ask for)
            zero = not np.any(expected[name])
            assert np.isfinite(b).all() and (b >= 0).all() and ((b > 0).any() or unchanged or zero), (case.label, name)
            assert not unchanged or (b == 0).all()


def test_bound_scales_with_the_dtype():
    y = {d: element_bounds(Case("batchnorm", (4, 3, 8), d), Case("batchnorm", (4, 3, 8), d).make_inputs())["y"].max()
         for d in ("f64", "f32", "bf16")}
    # Roughly proportional to each dtype's unit roundoff (2^-53, 2^-24, 2^-8), and never vacuous.
    assert y["f32"] / y["f64"] > 1e6 and y["bf16"] / y["f32"] > 1e3
    assert y["bf16"] < 0.5


@pytest.mark.parametrize("op", ["batchnorm", "groupnorm"])
def test_the_baseline_passes_the_formula_alone(op):
    # Judged against itself the baseline passes trivially; this checks the formula is not too tight (on the covering
    # design's cases: the scans' are small normal-data cases of the same dtypes)
    for case in default_sweep(op, narrowing=Narrowing(scans="without")):
        report = compare(op, "baseline", case, FORMULA_ONLY)
        assert report.verdict in (PASS, "MISTRUSTED"), f"{case.label}: {report.summary()}"


def test_the_baseline_passes_a_row_whose_xhat_lies_just_above_the_midpoint_below_one():
    """The fused ops' calibration's one false alarm (add + RMSNorm, before-weight chain, f32 residual stream, f16/f32,
    13 offset rows of 24): x̂ = 0.999755866, 7e-9 above f16's midpoint below 1, rounds to 1 in the reference and to
    1 − 2⁻¹¹ from float32; that flip times |dy| = 306.5 moved dγ by 0.15, 25 budgets while may_round_across looked
    for midpoints half an ulp of 1's binade away only."""
    case = Case("add_rmsnorm", (1, 13, 24), "f16", "f32", profile="offset", eps=1e-3, seed=2, weight_offset=1.0,
                casting="before-weight", residual_dtype="f32")
    report = compare("add_rmsnorm", "baseline", case, FORMULA_ONLY)
    # (the flip is most of the allowance: the bound was not widened past it)
    assert report.verdict == PASS and report.tensor("dweight").max_ratio > 0.25, report.summary()


def test_catastrophic_cancellation_is_visible_in_float64():
    # E[x²] − E[x]² at |mean|/std = 1e4 loses ~8 digits even in float64.
    case = Case("batchnorm", (8, 2, 4), "f64", profile="offset")
    inputs = case.make_inputs()
    x = inputs.x.transpose(1, 0, 2).reshape(2, -1)
    naive_var = (x * x).mean(1) - x.mean(1) ** 2
    true_var = x.var(1)
    allowed_relative = element_bounds(case, inputs)["invstd"] * np.sqrt(true_var + case.eps) * 2
    assert (np.abs(naive_var - true_var) / true_var > 2 * allowed_relative).all()


def _paths(op: str) -> list[dict]:
    """Every path the op's cases take: mode × frozen × order, those its record has."""
    record = OPS[op]
    modes = ("train", "eval") if record.running_stats else ("train",)
    orders = (1, 2, "fwd", "fwd-rev") if record.double_backward else (1,)
    return [dict(mode=m, frozen=f, order=o) for m in modes for f in FROZEN for o in orders]


@pytest.mark.parametrize("op", list(OPS))
def test_the_baseline_in_float64_is_the_reference_on_every_path(op):
    """The same-precision baseline evaluated in float64 is the reference itself, to 1e-12, on every path: it is the
    op's own math in another precision, so an op it did not know would show here first."""
    sweep = [c for c in default_sweep(op) if c.dtype == "f64" and c.numel <= 20_000 and c.affine is True][:3]
    assert sweep, f"{op}: no small affine float64 case in its default sweep"
    judged = set()
    for path, case in _on_every_path(op, sweep):
        judged.add(tuple(path.values()))
        inputs = case.make_inputs()
        ref, got = expected_outputs(case, inputs), baseline_outputs(case, inputs)
        for name, r in ref.items():
            assert got.get(name) is not None, f"{case.label}: the baseline gives no {name}"
            scale = max(1.0, float(np.max(np.abs(r), initial=0.0)))
            err = float(np.max(np.abs(got[name] - r), initial=0.0))
            assert err <= 1e-12 * scale, f"{case.label}: baseline {name} differs from the reference by {err:.3g}"
    assert judged == {tuple(p.values()) for p in _paths(op)}, f"{op}: paths never judged"


def _on_every_path(op: str, sweep, *extras: dict):
    """(path, case) for each case of `sweep` on every path the op has (and with each of `extras` besides), those it
    can take (not eps = 0 outside eval mode)."""
    for base in sweep:
        for path in _paths(op):
            for extra in ({}, *extras):
                try:
                    yield path, base.with_(**path, **extra)
                except UsageError:
                    continue


@pytest.mark.parametrize("op", list(OPS))
def test_a_baseline_given_the_reference_is_the_evaluated_one_bit_for_bit(op):
    """In float64 accumulation the baseline is the reference stored in each output's dtype (what the judge uses, with
    the reference at hand): bit for bit what evaluating the baseline again gives, on every path, an fp8 output too.
    In float32 accumulation the reference given changes nothing (the baseline is evaluated, and differs from it)."""
    sweep = [c for c in default_sweep(op) if c.numel <= 20_000]
    in_f64 = [c for c in sweep if c.dtypes.accumulation == "f64"][:1]
    in_f32 = [c for c in sweep if c.dtypes.accumulation == "f32"][:1]
    assert in_f64 and in_f32, f"{op}: no small case accumulated in float64 and in float32 in its default sweep"
    fp8 = ({"fp8": "e5m2"},) if "fp8" in {e.field for e in OPS[op].extensions} else ()
    for _, case in _on_every_path(op, in_f64 + in_f32, *fp8):
        inputs = case.make_inputs()
        with np.errstate(all="ignore"):
            evaluated = baseline_outputs(case, inputs)
            given = baseline_outputs(case, inputs, expected_outputs(case, inputs))
        for name, a in given.items():
            b = evaluated.get(name)
            assert (a is None) == (b is None), f"{case.label}: {name} given by one baseline only"
            assert a is None or (a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)), \
                f"{case.label}: {name} differs"


def test_independent_term_errors_grow_like_a_root_sum_of_squares_and_equal_ones_linearly():
    def summed(a):
        return a.sum(axis=0)
    rng = np.random.default_rng(0)
    varied = rng.uniform(0.5, 1.5, size=(4096, 3))
    bound = independent_errors_sum(varied, summed, 4096, CONSTANTS.growth)
    assert np.allclose(bound, CONSTANTS.growth * np.sqrt((varied ** 2).sum(axis=0)))
    assert (bound < varied.sum(axis=0) / 10).all()  # √M against M: what lets a long sum's bugs show
    same = np.full((4096, 3), 0.7)  # one element repeated: its errors are one error, M times
    assert np.allclose(independent_errors_sum(same, summed, 4096, CONSTANTS.growth), same.sum(axis=0))
    few = rng.uniform(0.5, 1.5, size=(2, 3))  # never above the worst case
    assert (independent_errors_sum(few, summed, 2, CONSTANTS.growth) <= few.sum(axis=0)).all()


def test_a_stage_that_rounds_what_the_norm_reads_widens_every_output_by_what_reading_the_unrounded_value_moves():
    # add + RMSNorm with a bf16 stream: statistics of x + residual in registers, the stored h normalised
    case = Case("add_rmsnorm", (257, 7), "bf16", "f32", profile="normal", normalized_dims=1)
    inputs = case.make_inputs()
    h = get_op("add_rmsnorm").reference(inputs)["h"]
    inner = inner_case(case, get_op("rmsnorm"))
    on_h = replace(inputs, case=inner, x=h, extra={})
    alone, either = element_bounds(inner, on_h), element_bounds(inner, on_h, unrounded=inputs.x + inputs.extra["residual"])
    for name in ("y", "dx", "dweight", "rstd"):
        assert (either[name] >= alone[name]).all() and (either[name] > alone[name]).any(), name
    assert (element_bounds(inner, on_h, unrounded=h)["dweight"] == alone["dweight"]).all()  # nothing rounded: nothing moved


def test_a_tensors_worst_element_and_largest_error_count_nan_as_inf_and_non_finite_ones_only_where_they_fail():
    """Ratios and errors take a short path when every one is finite: the report is the same as the long path's."""
    from normcheck.engine.report import tensor_report

    ref = np.array([[1.0, 2.0, 3.0], [4.0, np.inf, 6.0]])
    bound = np.full(ref.shape, 0.5)
    finite = ref[:, [0, 2]] + np.array([[0.1, 0.4], [-0.2, 0.3]])
    t = tensor_report("y", finite, ref[:, [0, 2]], budget_ratio(finite, ref[:, [0, 2]], bound[:, :2], None, "f64"), 2)
    assert t.worst_index == (0, 1) and t.max_ratio == pytest.approx(0.8) and t.nonfinite_mismatches == 0
    assert t.max_abs_error == pytest.approx(0.4) and t.unit_ratios == pytest.approx((0.4, 0.8))
    # a NaN ratio (an inf error against an inf allowance) before an inf one: the first is the worst (NaN as inf), the
    # largest error inf, and the elements not finite on either side whose ratio is inf counted
    got = np.array([[1.0, np.nan, 3.0], [4.0, np.inf, -np.inf]])
    bound[0, 1] = np.inf
    ratio = budget_ratio(got, ref, bound, None, "f64")
    assert np.isnan(ratio[0, 1]) and np.isinf(ratio[1, 2])
    t = tensor_report("y", got, ref, ratio, 3)
    assert t.worst_index == (0, 1) and np.isnan(t.max_ratio) and t.max_abs_error == np.inf
    assert t.nonfinite_mismatches == 1 and t.unit_ratios == (0.0, np.inf, np.inf)
