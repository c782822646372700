"""Hints: a failing row judged again under the conventions the implementation did not declare (and eval mode) says
under which it passes (engine.hints), never as a verdict; a wrong implementation gets none, a declared convention is
never judged otherwise, and a passing run judges nothing again. Each kind of failure is searched once, and what
explained it reaches every row it explains; a replay line takes the options a hint names."""
from __future__ import annotations

import io
import json

import pytest
import torch

from normcheck import Case, resolve_impl
from normcheck.cases.tokens import encode_case
from normcheck.cli import main
from normcheck.engine import FAIL, MISTRUSTED, PASS, SKIP, hint_again, judge
from normcheck.outputs.table import late_hint_lines
from normcheck.engine.hints import further
from normcheck.pytest_plugin import failure_message

LAYERS = "tests._real_layers"
LLAMA = {"casting": "before-weight", "output_dtype": "promote", "compute_dtype": "f32"}
MIXED_RMS = Case("rmsnorm", (8, 64), dtype="bf16", param_dtype="f32")


def judged(op: str, spec: str, case: Case, declared: dict | None = None):
    """(the report of `spec` on `case`, its bound record: the hint search's probes are on it)."""
    impl = resolve_impl(op, spec).declaring(declared or {})
    return judge(case, impl), impl


@pytest.mark.parametrize("op, spec, case, declarations", [
    ("layernorm", f"{LAYERS}:promoting_layer_norm", Case("layernorm", (8, 64), dtype="bf16", param_dtype="f32"),
     {"output_dtype": "promote"}),
    ("layernorm", f"{LAYERS}:fp32_layer_norm", Case("layernorm", (8, 64), dtype="f64"), {"compute_dtype": "f32"}),
    ("rmsnorm", f"{LAYERS}:rms_before_weight", MIXED_RMS, {"casting": "before-weight"}),
    ("rmsnorm", f"{LAYERS}:gemma_rms_norm", Case("rmsnorm", (8, 64), dtype="bf16"), {"weight_offset": 1.0}),
    ("layernorm", f"{LAYERS}:convnext_layer_norm", Case("layernorm", (4, 6, 5, 5)), {"normalized_at": "channels"}),
    ("layernorm", f"{LAYERS}:layer_norm_2d", Case("layernorm", (4, 6, 5, 5)), {"normalized_at": "channels"}),
    ("add_rmsnorm", "tests._hint_layers:add_rms_norm_returning_y", Case("add_rmsnorm", (8, 64)), {"returns": "y"}),
], ids=lambda v: v.split(":")[-1] if isinstance(v, str) and ":" in v else None)
def test_a_layer_that_follows_an_undeclared_convention_fails_with_a_hint_naming_it(op, spec, case, declarations):
    report, _ = judged(op, spec, case)
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == declarations
    assert judge(case.with_(**declarations), resolve_impl(op, spec)).verdict != FAIL  # (the hint is right)


def test_the_hint_names_the_option_and_what_following_it_means():
    report, _ = judged("layernorm", f"{LAYERS}:fp32_layer_norm", Case("layernorm", (8, 64), dtype="f64"))
    assert str(report.hint) == ("it passes with --compute-dtype f32 declared (the implementation computes in float32 at "
                                "most): declare it if that is how it is written")
    gemma, _ = judged("rmsnorm", f"{LAYERS}:gemma_rms_norm", Case("rmsnorm", (8, 64)))
    assert "--weight-offset 1 declared (the implementation scales by 1 + w)" in str(gemma.hint)


def test_a_llama_style_rms_norm_needs_two_declarations_and_the_hint_names_both():
    report, _ = judged("rmsnorm", f"{LAYERS}:llama_rms_norm", MIXED_RMS)
    assert report.verdict == FAIL and report.message.startswith("y has dtype f32"), report.summary()
    assert report.hint.declarations == (("output_dtype", "promote"), ("casting", "before-weight"))
    assert str(report.hint).startswith("it passes with --output-dtype promote --casting before-weight declared (the "
                                       "implementation returns y as result_type over x and its parameters and "
                                       "buffers and rounds x̂ to the input dtype before the weight): declare them")


def test_a_declared_convention_is_never_judged_otherwise():
    declared = {"output_dtype": "input"}  # (wrongly: the layer promotes, so nothing else can make it pass)
    report, impl = judged("rmsnorm", f"{LAYERS}:llama_rms_norm", MIXED_RMS, declared)
    assert report.verdict == FAIL and report.hint is None
    assert impl.hints.probes > 0 and not any("output_dtype" in probe for probe in impl.hints.probed)


def test_the_command_lines_convention_options_are_declarations():
    argv = ["compare", "--one-case", "--op", "rmsnorm", "--impl", f"{LAYERS}:llama_rms_norm", "--shape", "8,64", "--dtype",
            "mixed-bf16"]
    hints = {}
    for declared in ([], ["--output-dtype", "input"]):
        out = io.StringIO()
        assert main(argv + declared, out) == 1
        hints[bool(declared)] = [line for line in out.getvalue().splitlines() if line.startswith("    hint: ")]
    assert hints[False] == ["    hint: it passes with --output-dtype promote --casting before-weight declared (the "
                            "implementation returns y as result_type over x and its parameters and buffers and rounds x̂ to "
                            "the input dtype before the weight): declare them if that is how it is written"]
    assert hints[True] == []


@pytest.mark.parametrize("declared", [{}, LLAMA], ids=["nothing declared", "everything declared"])
def test_a_wrong_implementation_that_no_declaration_explains_gets_no_hint(declared):
    case = MIXED_RMS.with_(**declared)
    report, impl = judged("rmsnorm", f"{LAYERS}:llama_rms_norm_off_by_a_little", case, declared)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert impl.hints.probes > 0  # (searched, and found nothing)


def test_a_bug_that_only_a_wider_budget_would_hide_gets_no_hint():
    """A float64 naive variance's cancellation passes float32's budget by a factor of 10^6: an error that size says
    nothing of a layer computing in float32, so compute_dtype f32 explains nothing."""
    from tests.mutants.batchnorm import naive_variance

    case = Case("batchnorm", (1025, 3), "f64", profile="offset", frozen="params")
    report, impl = judged("batchnorm", naive_variance, case)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert {"compute_dtype": "f32"} in impl.hints.probed
    assert judge(case.with_(compute_dtype="f32"), resolve_impl("batchnorm", naive_variance)).verdict != FAIL


def test_a_declaration_under_which_an_output_moves_further_from_what_was_computed_explains_nothing():
    """An RMSNorm whose mean of squares is accumulated in float16 (a bug) passes under --casting rstd-input, whose
    wider budget takes dx's ratio 1.11 under 1, while y's and dweight's errors grow: it was hinted so. A hint explains
    the error on every output."""
    case = Case("rmsnorm", (4096, 16), dtype="f16", param_dtype="f32", eps=None)
    spec = "tests._hint_layers:rms_norm_f16_variance"
    report, impl = judged("rmsnorm", spec, case)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert {"casting": "rstd-input"} in impl.hints.probed
    under = judge(case.with_(casting="rstd-input"), resolve_impl("rmsnorm", spec))
    assert under.verdict != FAIL and further(report, under) == ["y", "dweight"], under.summary()


def test_a_passing_run_judges_nothing_again():
    impl = resolve_impl("layernorm", f"{LAYERS}:fp32_layer_norm")
    cases = [Case("layernorm", shape, dtype=dtype) for shape in ((8, 64), (4, 3, 16)) for dtype in ("f32", "bf16")]
    assert all(judge(case, impl).verdict != FAIL for case in cases)
    assert impl.hints.probes == 0


VITDET = "tests._hint_layers:ViTDetLayerNorm"


def test_a_layer_written_for_4d_input_skips_other_ranks_and_its_4d_rows_carry_the_hint():
    """ViTDet's LayerNorm broadcasts its weight as weight[:, None, None], which meets dim 1 of 4-D input only: its 3-D
    rows are the layer's limit (SKIP, saying so), not failures; its 4-D rows pass with channels-first sets."""
    impl = resolve_impl("layernorm", VITDET)
    for shape in ((4, 6, 5), (2, 5, 4)):
        report = judge(Case("layernorm", shape), impl)
        assert report.verdict == SKIP and "[:, None, None]" in report.message and "4-D" in report.message, \
            report.summary()
    for shape in ((3, 6, 5, 5), (2, 5, 6, 6)):
        report = judge(Case("layernorm", shape), impl)
        assert report.hint is not None and dict(report.hint.declarations) == {"normalized_at": "channels"}, shape


def test_sets_found_apart_are_tried_together_where_they_agree():
    """torchvision's frozen BatchNorm: its float32 rows found --mode eval and a mixed eval row --output-dtype promote,
    each alone; its f16/f32 training rows need both, which no search of their own found (a row too large to search,
    a kind searched on a row nothing explained): the union is tried too, and never where two sets disagree."""
    from normcheck.engine.hints import HintSearch
    search = HintSearch(explained=[{"mode": "eval"}, {"output_dtype": "promote"}])
    assert search._together() == [{"mode": "eval", "output_dtype": "promote"}]
    assert HintSearch(explained=[{"mode": "eval"}, {"mode": "train", "output_dtype": "promote"}])._together() == []
    assert HintSearch(explained=[{"mode": "eval"}])._together() == []


def test_a_row_judged_before_its_kind_was_explained_carries_the_hint_at_the_end_of_the_run():
    """A one-channel row of ViTDet's LayerNorm cannot tell channels-first sets apart (one value each): judged first it
    gets no hint; once a row of several channels found it, the run's last pass gives it the same hint, and the
    table's closing line names it."""
    impl = resolve_impl("layernorm", VITDET)
    first = judge(Case("layernorm", (2, 1, 5, 5)), impl)
    assert first.verdict == FAIL and first.hint is None, first.summary()
    assert not hint_again(first, impl)  # (nothing explained yet)
    assert judge(Case("layernorm", (3, 6, 5, 5)), impl).hint is not None
    assert hint_again(first, impl) and dict(first.hint.declarations) == {"normalized_at": "channels"}
    [line] = late_hint_lines([first])
    assert line.startswith("hint, for 1 FAIL row above judged before a row of their kind was explained (2x1x5x5")
    assert line.endswith(str(first.hint))


def test_rows_of_a_wrong_rank_are_a_kind_of_their_own_and_leave_the_search_to_the_rows_a_hint_explains():
    """ViTDet's LayerNorm written so that no shape in its source says it is 4-D only: 3-D rows raise whatever is
    declared, 4-D ones pass with channels-first sets. The 3-D rows (more of them than a run once searched) are one
    kind, searched once; the 4-D rows are another, and every one of them carries the hint."""
    impl = resolve_impl("layernorm", "tests._hint_layers:UnsqueezedViTDetLayerNorm")
    probes = []
    for shape in ((4, 6, 5), (4, 6, 7), (2, 5, 4), (3, 6, 9)):
        report = judge(Case("layernorm", shape), impl)
        assert report.verdict == FAIL and report.message.startswith("raised RuntimeError") and report.hint is None
        probes.append(impl.hints.probes)
    assert probes[0] > 0 and probes[-1] == probes[0]  # (searched once; nothing found, so nothing to retry)
    for shape in ((3, 6, 5, 5), (2, 4, 3, 7), (2, 5, 6, 6)):
        report = judge(Case("layernorm", shape), impl)
        assert report.hint is not None and dict(report.hint.declarations) == {"normalized_at": "channels"}, shape


MAMBA2_GATED = "tests._layer_classes:RequiredGroupsGatedRMSNorm"


def test_a_declaration_that_makes_every_set_one_value_is_not_hinted():
    """A Mamba2-style gated RMSNorm (transformers' Mamba2RMSNormGated: the gate before the norm, the last dim
    normalised in float32, x̂ rounded to x's dtype before the weight, a group size it requires) on a row whose dim 1 has
    size 1. Channels-first sets are then one value each, and the layer, built with a group of prod(normalized_shape) =
    1, normalises each value alone along its last dim: the same x/√(x² + eps) = ±1, exact in float16, so the casting
    error vanished and it was hinted --normalized-at channels. The search does not judge sets of one value; the casting
    chain is the hint, and the row passes under it."""
    declared = {"compute_dtype": "f32", "output_dtype": "promote"}
    case = Case("gate_rmsnorm", (1, 1, 7, 256), "f16", "f32", profile="big", eps=None, seed=1, **declared)
    report, impl = judged("gate_rmsnorm", MAMBA2_GATED, case, declared)
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == {"casting": "before-weight"}, str(report.hint)
    assert not any("normalized_at" in probe for probe in impl.hints.probed)
    layer = resolve_impl("gate_rmsnorm", MAMBA2_GATED)
    assert judge(case.with_(casting="before-weight"), layer).verdict != FAIL
    assert judge(case.with_(normalized_at="channels"), layer).verdict != FAIL  # (what the hint was: a pass of one value)


def test_a_row_whose_declared_sets_are_one_value_carries_a_hint_found_on_sets_of_several():
    """ViTDet's LayerNorm on 4-D rows with C = 1: channels-first sets of one value are not searched on them (they pass
    whatever dims a layer normalises), but once a row with C > 1 found --normalized-at channels, they carry it."""
    impl = resolve_impl("layernorm", VITDET)
    one_value = Case("layernorm", (2, 1, 5, 5))
    report = judge(one_value, impl)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert not any("normalized_at" in probe for probe in impl.hints.probed)
    assert dict(judge(Case("layernorm", (3, 6, 5, 5)), impl).hint.declarations) == {"normalized_at": "channels"}
    for shape in ((2, 1, 5, 5), (2, 1, 3, 7)):
        report = judge(Case("layernorm", shape), impl)
        assert report.hint is not None and dict(report.hint.declarations) == {"normalized_at": "channels"}, shape


def test_a_search_on_a_row_of_one_value_sets_starts_from_what_sets_of_several_found():
    """ViTDet's LayerNorm on a mixed row with C = 1 needs channels-first sets and y promoted with its float32 parameters.
    Its mixed rows of several channels fail whatever is declared (statistics in half precision), so no row found both;
    its own search may not judge channels-first sets of one value on their own, but takes them as given once a float32
    row of several channels found them, and finds --output-dtype promote on top; its kind, closed after its deferrals
    (as ViTDet's sweep's mixed rows of one channel came first), is searched again once a set is found."""
    from normcheck.engine.hints import DEFERRALS
    impl = resolve_impl("layernorm", VITDET)
    mixed = Case("layernorm", (2, 1, 3, 7), "bf16", "f32")
    for seed in range(DEFERRALS + 1):
        assert judge(mixed.with_(seed=seed), impl).hint is None  # (nothing found on sets of several yet)
    assert dict(judge(Case("layernorm", (3, 6, 5, 5)), impl).hint.declarations) == {"normalized_at": "channels"}
    report = judge(mixed, impl)
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == {"normalized_at": "channels", "output_dtype": "promote"}
    declared = {"normalized_at": "channels", "output_dtype": "promote"}
    declaring = resolve_impl("layernorm", VITDET).declaring(declared)
    assert judge(mixed.with_(**declared), declaring).verdict in (PASS, MISTRUSTED)  # (dx is 0 on sets of one value)


GEMMA = "tests._layer_classes:GemmaStyleRMSNorm"


def test_a_hint_reaches_every_row_of_its_kind_with_one_probe_each():
    """Gemma's layer class: float64 rows need float32 compute and 1 + w, float32 rows 1 + w alone (float32 compute changes
    nothing there, and a hint names only what explains its row); one search per kind, then one probe a row."""
    impl = resolve_impl("rmsnorm", GEMMA)
    hints = {}
    for dtype in ("f64", "f32"):
        for k, shape in enumerate(((8, 64), (16, 32), (5, 128))):
            before = impl.hints.probes
            report = judge(Case("rmsnorm", shape, dtype, seed=k), impl)
            assert report.verdict == FAIL and report.hint is not None, report.summary()
            hints.setdefault(dtype, set()).add(report.hint.declarations)
            assert k == 0 or impl.hints.probes == before + 1
    assert hints == {"f64": {(("compute_dtype", "f32"), ("weight_offset", 1.0))}, "f32": {(("weight_offset", 1.0),)}}


def test_the_searches_a_run_spends_are_bounded():
    """Past the run's budget of searches, a new kind of failure is judged only under what explained another."""
    wrong = resolve_impl("rmsnorm", f"{LAYERS}:llama_rms_norm_off_by_a_little")
    wrong.hints.searches = 1
    assert judge(MIXED_RMS, wrong).hint is None and wrong.hints.probes > 0
    searched = wrong.hints.probes
    assert judge(MIXED_RMS.with_(shape=(2, 4, 64)), wrong).hint is None  # (another rank: another kind)
    assert wrong.hints.probes == searched and wrong.hints.searches == 0


FROZEN_BN = "tests._layer_classes:FrozenBatchNorm2d"


@pytest.mark.parametrize("case, declarations", [
    (Case("batchnorm", (4, 3, 5, 5), "f64"), {"mode": "eval"}),
    (Case("batchnorm", (4, 3, 5, 5), "f32", order=2), {"mode": "eval"}),
    (Case("batchnorm", (4, 3, 5, 5), "bf16", "f32"), {"output_dtype": "promote", "mode": "eval"}),
    # (dbias, a sum of 191 values, moves by float64 roundings between the two references: no growth that counts)
    (Case("batchnorm", (1, 3, 1, 191), "f64"), {"mode": "eval"}),
    (Case("batchnorm", (2, 3, 8, 12), "f64"), {"mode": "eval"}),
], ids=["f64", "f32 order 2", "mixed", "f64 long sums", "f64 long sums 2"])
def test_a_frozen_batchnorm_is_hinted_to_eval_mode(case, declarations):
    """detectron2's FrozenBatchNorm2d normalises with its running statistics in training mode too: its training rows
    fail, and the hint says to run it in eval mode (a frozen BatchNorm has no training mode)."""
    report, _ = judged("batchnorm", FROZEN_BN, case)
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == declarations
    assert "--mode eval" in str(report.hint) and "always normalises with its running statistics" in str(report.hint)
    assert "--normcheck-mode eval" in failure_message(report, None)
    assert judge(case.with_(**declarations), resolve_impl("batchnorm", FROZEN_BN)).verdict != FAIL


def test_a_frozen_batchnorms_folded_statistics_are_within_the_bound_of_ys_jvp():
    """A frozen BatchNorm folds the running statistics into y = x·(γr) + (β − μγr), so y's JVP along γ̇ rounds x·γ̇r
    and μ·γ̇r apart, as y's own bound has it; the directional bound had (x − μ)·r's rounding alone. torchvision's
    FrozenBatchNorm2d's f64 fwd-rev row of 2x16x128x256 (heavy-tailed x) then failed under --mode eval (jvp_y 3.73
    budgets, 1.4e-14 off): too large to search, it got no hint from the set its other rows found. It passes at 0.11
    now; eps added outside the root still fails it."""
    impl = resolve_impl("batchnorm", FROZEN_BN)
    assert dict(judge(Case("batchnorm", (4, 3, 5, 5), "f64"), impl).hint.declarations) == {"mode": "eval"}
    folded = Case("batchnorm", (2, 16, 128, 256), "f64", None, "transposed", "sliced", "heavy_tailed", eps=1e-10,
                  momentum=0.0, frozen="x", order="fwd-rev")
    report = judge(folded, impl)
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == {"mode": "eval"}
    broken = judge(folded.with_(mode="eval"), resolve_impl("batchnorm", "tests._layer_classes:BrokenFrozenBatchNorm2d"))
    assert broken.verdict == FAIL, broken.summary()


def test_eval_mode_explains_no_bug_of_the_batch_statistics():
    """Eval mode never forms batch statistics, so a BatchNorm with a bug there passes it: the hint judges the row's own
    (training) call against eval mode's expectations, which only a layer that ignores the mode meets."""
    from tests.mutants.batchnorm import naive_variance

    case = Case("batchnorm", (64, 3), "f32", profile="offset")
    report, impl = judged("batchnorm", naive_variance, case)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert {"mode": "eval"} in impl.hints.probed
    assert judge(case.with_(mode="eval"), resolve_impl("batchnorm", naive_variance)).verdict != FAIL


def test_a_float64_bug_a_few_ulps_wide_gets_no_float32_hint():
    """y off by 64 ulps, its gradients exact: float32's budget would hide it. On an eps=None row float32 compute also
    means float32's eps, a float32-sized shift on every output that excused it; against the same reference (eps pinned)
    its error is a billionth of float32's budget."""
    case = Case("rmsnorm", (8, 64), "f64", eps=None)
    report, impl = judged("rmsnorm", "tests._hint_layers:rms_norm_off_in_y", case)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert {t.name: t.verdict for t in report.tensors} == {"y": FAIL, "dx": "PASS", "dweight": "PASS"}
    assert {"compute_dtype": "f32"} in impl.hints.probed


def test_a_layer_that_ignores_eps_gets_no_float32_hint():
    """lucidrains' F.normalize(x)·√d·g ignores eps: at eps 1e-12 on small data its error is float32-sized on every
    output, so float32's budget lets it through on that row by luck; at eps 1e-2 it is far beyond it."""
    case = Case("rmsnorm", (8, 64), "f64", eps=1e-12, profile="tiny")
    spec = "tests._hint_layers:NormalizeRMSNorm"
    report, impl = judged("rmsnorm", spec, case)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert judge(case.with_(compute_dtype="f32"), resolve_impl("rmsnorm", spec, hints=False)).verdict != FAIL  # (luck)
    assert {"compute_dtype": "f32", "eps": 1e-2} in impl.hints.probed


def test_a_layer_that_fixes_its_eps_is_hinted_float32_where_it_computes_so():
    """OLMo's LayerNorm writes eps=1e-5 and computes in float32: its float64 rows FAILed with no hint (282 of its
    sweep), the search's probe at another eps being a SKIP, read as a failure. Where the layer takes one eps only, the
    widening is judged on data whose statistic is about that eps instead, and it holds there."""
    case = Case("layernorm", (4, 64), "f64", eps=1e-5, affine=False)
    report, impl = judged("layernorm", "tests._layer_classes:LiteralEpsLayerNorm", case)
    assert report.verdict == FAIL and report.hint is not None, report.summary()
    assert dict(report.hint.declarations) == {"compute_dtype": "f32"}
    assert {"compute_dtype": "f32", "profile": "near_constant"} in impl.hints.probed


def test_a_fixed_eps_of_another_form_gets_no_float32_hint():
    """lucidrains' F.normalize(x)·√d·g with F.normalize imported at module level: its eps, F.normalize's default 1e-12,
    is fixed, so it cannot be judged at eps 1e-2; at data whose mean square is about 1e-12 its floor is far from
    RMSNorm's eps, and float32's budget is not named for the row it passes by luck."""
    case = Case("rmsnorm", (8, 64), "f64", eps=1e-12, profile="tiny")
    report, impl = judged("rmsnorm", "tests._layer_classes:NormalizeRMSNorm", case)
    assert report.verdict == FAIL and report.hint is None, report.summary()
    assert {"compute_dtype": "f32", "profile": "near_constant"} in impl.hints.probed


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def test_a_replay_line_takes_the_options_a_hint_names(capsys):
    """The hint's options appended to the row's replay line judge the same inputs under them; any other case option
    is still refused (the token names the whole case)."""
    case = Case("rmsnorm", (8, 64), "f64")
    replay = ["compare", "--op", "rmsnorm", "--impl", GEMMA, "--case", encode_case(case)]
    code, out = _run(replay + ["--json"])
    hint = json.loads(out)["cases"][0]["hint"]
    assert code == 1 and hint.startswith("it passes with --compute-dtype f32 --weight-offset 1 declared")
    code, out = _run(replay + ["--compute-dtype", "f32", "--weight-offset", "1"])
    assert code == 0 and "1 passed, 0 failed" in out
    frozen = ["compare", "--op", "batchnorm", "--impl", FROZEN_BN, "--case", encode_case(Case("batchnorm", (4, 3, 5, 5)))]
    assert _run(frozen + ["--mode", "eval"])[0] == 0
    assert _run(replay + ["--dtype", "f32"])[0] == 2
    assert capsys.readouterr().err.strip() == (
        "normcheck: error: --case names the whole case; drop --dtype (beside it, a replay line takes only the options a "
        "hint names: --normalized-at, --weight-offset, --casting, --output-dtype, --compute-dtype)")


def test_a_row_that_ran_out_of_time_is_not_searched():
    """No declaration explains a hang, and every probe of one would wait out a limit (and count as a case that
    timed out: tests/test_stuck.py)."""
    impl = resolve_impl("batchnorm", "tests._solo_faults:hangs_on_bf16", timeout=1.5)
    report = judge(Case("batchnorm", (4, 3, 5), "bf16"), impl)
    assert report.verdict == FAIL and report.message.startswith("timed out after"), report.summary()
    assert report.hint is None and impl.hints.probes == 0


def test_hints_can_be_switched_off():
    impl = resolve_impl("rmsnorm", f"{LAYERS}:gemma_rms_norm", hints=False)
    report = judge(Case("rmsnorm", (8, 64)), impl)
    assert report.verdict == FAIL and report.hint is None and impl.hints is None
    out = io.StringIO()
    assert main(["compare", "--one-case", "--op", "rmsnorm", "--impl", f"{LAYERS}:gemma_rms_norm", "--shape", "8,64",
                 "--no-hints"], out) == 1
    assert "hint:" not in out.getvalue()


def test_the_json_report_and_the_plugins_failure_text_carry_the_hint():
    out = io.StringIO()
    assert main(["compare", "--one-case", "--op", "rmsnorm", "--impl", f"{LAYERS}:gemma_rms_norm", "--shape", "8,64", "--json"],
                out) == 1
    assert json.loads(out.getvalue())["cases"][0]["hint"].startswith("it passes with --weight-offset 1 declared")
    report, _ = judged("rmsnorm", f"{LAYERS}:llama_rms_norm", MIXED_RMS)
    text = failure_message(report, None)
    assert text.splitlines()[-1].startswith(
        "hint: it passes with --normcheck-output-dtype promote --normcheck-casting before-weight declared")
    returns, _ = judged("add_rmsnorm", "tests._hint_layers:add_rms_norm_returning_y", Case("add_rmsnorm", (8, 64)))
    assert "hint: it passes with --normcheck-follows returns=y declared" in failure_message(returns, None)


_CALLS = []


def noisy_at_first_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Other bits on its first two calls (a racing reduction's signature), the same bits on every later one."""
    _CALLS.append(1)
    y = torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)
    return y + (torch.rand_like(y) * torch.finfo(y.dtype).eps * y.abs()).detach() if len(_CALLS) <= 2 else y


def test_a_row_that_fails_a_promise_not_its_values_gets_no_hint():
    """Nondeterminism is no convention: a probe that happens to run deterministically under --output-dtype promote
    (an f64 case, where promoting changes nothing) does not explain it."""
    bound = resolve_impl("layernorm", noisy_at_first_layer_norm, backend="in-process")
    report = judge(Case("layernorm", (64, 32), "f64", normalized_dims=1), bound)
    assert report.verdict == FAIL and report.message.startswith("not deterministic") and report.hint is None
    assert bound.hints.probes == 0
