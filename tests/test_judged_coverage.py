"""Coverage that survives what an implementation cannot do (issue 58): a case is judged as far as the implementation
goes; what it cannot do (a backward only once differentiable, no forward-mode formula, normcheck.Unsupported, a layer
constructor that takes one size or has no bias, an input rank) narrows the covering design as an option does, so every
other pair is judged; every report gives the pairs judged against the pairs designed and names what none judged.
Real torch, real worker processes; the reports of the arithmetic test are built from the design's own cases, and the
probing test asks a plain function."""
from __future__ import annotations

import io
import json
import pickle
from itertools import combinations

import pytest

from normcheck import Case, compare
from normcheck.cases.narrowing import Limit, Narrowing
from normcheck.cases.probing import probed_narrowing
from normcheck.cases.sweep import admits, coverage, default_sweep, narrowed_design
from normcheck.cli import main
from normcheck.core.errors import NotDifferentiable, Unsupported
from normcheck.engine.coverage import judged_coverage, narrowing_hint
from normcheck.engine.report import FAIL, PASS, SKIP, Report
from normcheck.impls import resolve_impl
from normcheck.impls.limits import learned
from normcheck.ops import get_op

HERE = "tests._limited_impls"
DESIGN = Narrowing(scans="without")


def run(*argv) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def pairs_of(op: str, cases) -> set:
    """Every pair of levels the cases cover, counted here from the factors' own reads."""
    fs = narrowed_design(op)[0]
    levels = {f.name: set(map(repr, f.values)) for f in fs}
    out = set()
    for case in cases:
        read = {f.name: repr(f.read(case)) for f in fs}
        out |= {(a, read[a], b, read[b]) for a, b in combinations(sorted(read), 2)
                if read[a] in levels[a] and read[b] in levels[b]}
    return out


def test_the_pairs_judged_are_those_the_judged_cases_cover_and_what_none_covered_says_why():
    cases = default_sweep("layernorm", narrowing=DESIGN)
    skipped = [c for c in cases if c.dtype == "bf16"]
    reports = [Report("layernorm", "test", c, SKIP if c in skipped else PASS,
                      message="not supported: no bf16 kernel" if c in skipped else "") for c in cases]
    covered = judged_coverage("layernorm", reports, DESIGN)
    judged = pairs_of("layernorm", [c for c in cases if c not in skipped])
    assert covered.designed == len(pairs_of("layernorm", cases)) and covered.judged == len(judged)
    assert 0 < covered.lost < covered.designed
    assert covered.never[0] == "dtype=bf16/bf16: only in skipped cases (no bf16 kernel)"
    # the other pairs lost are pairs of levels each judged somewhere, named with the SKIP row that carried them
    named = [line for line in covered.never if " × " in line]
    assert named and all(line.endswith("only in skipped cases (no bf16 kernel)") for line in named)
    assert covered.text() == f"{covered.judged} of {covered.designed} pairs judged"


def test_a_limit_narrows_the_design_and_the_covering_array_covers_every_pair_within_it():
    limit = Limit("order", declines=(2, "fwd-rev"), why="only once differentiable")
    narrowing = Narrowing.of(scans="without", limits=(limit,))
    order = next(f for f in narrowed_design("layernorm", narrowing)[0] if f.name == "order")
    assert order.values == (1, "fwd")
    cases = default_sweep("layernorm", narrowing=narrowing)
    assert {c.order for c in cases} == {1, "fwd"}
    values, pairs = coverage("layernorm", cases, narrowing)
    assert all(n for counts in values.values() for n in counts.values())
    assert all(n for counts in pairs.values() for n in counts.values())
    assert not admits("layernorm", cases[0].with_(order=2), narrowing) and admits("layernorm", cases[0], narrowing)
    with pytest.raises(ValueError, match="no level of order is left: every order"):
        narrowed_design("layernorm", narrowing.with_limits((Limit("order", takes=(3, 4), why="every order"),)))


def test_what_it_says_it_takes_travels_from_a_worker_process():
    e = pickle.loads(pickle.dumps(NotDifferentiable("why", declines={"order": [2]})))
    assert isinstance(e, NotDifferentiable) and e.declines == {"order": (2,)} and str(e) == "why"
    assert pickle.loads(pickle.dumps(Unsupported("one size", takes={"normalized_dims": (1,)}))).takes == {
        "normalized_dims": (1,)}


def test_a_once_differentiable_kernel_without_a_jvp_is_narrowed_to_order_1_and_every_other_pair_is_judged():
    code, out = run("compare", "--op", "layernorm", "--impl", f"{HERE}:once_differentiable_layer_norm", "--scans",
                    "without", "--profile", "normal", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["skip"] == 0 and doc["summary"]["fail"] == 0
    assert {c["case"]["order"] for c in doc["cases"]} == {1}
    assert doc["narrowed"][0].startswith("narrowed: order 1 only (not 2: only once differentiable")
    assert "not fwd, fwd-rev: no forward-mode derivative" in doc["narrowed"][0]
    # every pair lost involves an order it cannot do: no pair of other levels, no other value
    pairs = doc["summary"]["pairs"]
    lost = [line for line in doc["summary"]["never_checked"] if "=" in line]
    assert pairs["judged"] < pairs["designed"] and [line.split(":")[0] for line in lost] == [
        "order=2", "order=fwd", "order=fwd-rev"]
    assert all(": narrowed away: " in line for line in lost)


def test_a_bug_on_a_pair_that_only_higher_order_cases_carried_fails_the_sweep():
    """bf16 x rows of two values, met mostly in order-2 and forward-mode cases of the design (once only in those: then
    they were SKIP rows and the kernel passed); the design narrows to order 1 and covers the pair in order-1 cases."""
    bugged = [c for c in default_sweep("layernorm") if c.dtype == "bf16" and c.view.set_size == 2]
    assert bugged and sum(c.order != 1 for c in bugged) > len(bugged) // 2
    code, out = run("compare", "--op", "layernorm", "--impl", f"{HERE}:bf16_pair_row_layer_norm", "--scans", "without",
                    "--dtype", "bf16")
    failing = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert code == 1 and any(" y: ratio" in line and "x2 D=1 bf16" in line for line in failing), failing


def test_a_layer_class_narrows_to_the_sizes_and_parameters_its_constructor_takes():
    impl = resolve_impl("rmsnorm", "tests._layer_classes:LlamaStyleRMSNorm")
    narrowing = learned(get_op(impl.op), impl, Narrowing.of({"casting": "before-weight", "output_dtype": "promote",
                                            "compute_dtype": "f32"}, scans="without"))
    cases = default_sweep("rmsnorm", narrowing=narrowing)
    assert {c.normalized_dims for c in cases} == {1} and {c.affine for c in cases} == {True}
    assert {lim.name for lim in narrowing.limits} == {"normalized_dims", "affine"}
    assert len(cases) > 100 and len({c.dtype for c in cases}) > 3  # (a sweep, every other factor kept)


def test_a_function_written_for_4d_input_gets_a_hint_naming_the_rank_and_the_option_narrows_to_it():
    """Its raising is no signal (any kernel may crash): those rows FAIL, and the run names the option."""
    code, out = run("compare", "--op", "batchnorm", "--impl", f"{HERE}:batch_norm_4d_only", "--scans", "without",
                    "--dtype", "f64", "--memory-format", "contiguous")
    lines = out.splitlines()
    assert code == 1 and lines[-1] == ("hint: every rank 2, 3, 5 case raised ValueError: expected 4D input (got 2D "
                                       "input); rank 4 runs without it: --rank 4")
    code, out = run("compare", "--op", "batchnorm", "--impl", f"{HERE}:batch_norm_4d_only", "--scans", "without",
                    "--dtype", "f64", "--memory-format", "contiguous", "--rank", "4", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["hint"] is None and len(doc["cases"]) > 20
    assert {len(c["case"]["shape"]) for c in doc["cases"]} == {4}
    # a rank the run leaves out is not a loss: the design asked for rank 4
    assert doc["summary"]["pairs"]["judged"] == doc["summary"]["pairs"]["designed"]


def test_a_module_holding_batchnorm2d_narrows_to_the_rank_that_class_checks_for():
    code, out = run("compare", "--op", "batchnorm", "--impl", f"{HERE}:WrapsBatchNorm2d", "--scans", "without",
                    "--dtype", "f64", "--memory-format", "contiguous", "--json")
    doc = json.loads(out)
    assert doc["summary"]["skip"] == 0 and {len(c["case"]["shape"]) for c in doc["cases"]} == {4}
    assert not any(c["message"].startswith("raised") for c in doc["cases"])
    rank = next(line for line in doc["narrowed"] if line.startswith("narrowed: rank"))
    assert rank.startswith("narrowed: rank 4 only (not 2, 3, 5: tests._limited_impls:WrapsBatchNorm2d's BatchNorm2d "
                           "takes other input ranks (expected 4D input (got ")
    # the paths without a weight or a bias are narrowed away too: its constructor always gives both
    assert all(line.startswith(("path=", "rank=")) and ": narrowed away: " in line for line in doc["summary"]["never_checked"])


def test_a_module_holding_instancenorm2d_as_it_defaults_is_judged_without_parameters_and_running_statistics():
    code, out = run("compare", "--op", "instancenorm", "--impl", f"{HERE}:WrapsInstanceNorm2d", "--scans", "without",
                    "--profile", "normal", "--json")
    doc = json.loads(out)
    narrowed = "\n".join(doc["narrowed"])
    assert "narrowed: running_stats none only: " in narrowed and "narrowed: rank 4 only (not 3: " in narrowed
    assert "narrowed: path no parameters only" in narrowed and "narrowed: mode train only" in narrowed
    cases = doc["cases"]
    assert doc["summary"]["skip"] == 0 and len(cases) > 20
    assert {(c["case"]["running_stats"], c["case"]["affine"], len(c["case"]["shape"])) for c in cases} == {
        ("none", False, 4)}
    # what fails is torch's own recorded issue (a batch of one with a channels-last dy), met through a class
    failing = [c for c in cases if c["verdict"] == "FAIL"]
    assert all(c["case"]["shape"][0] == 1 and c["case"]["dy_format"].startswith("channels_last") for c in failing)


def test_no_hint_where_the_raising_rows_share_their_levels_with_rows_that_run():
    cases = default_sweep("batchnorm", narrowing=DESIGN)
    raised = [Report("batchnorm", "t", c, FAIL, message="raised RuntimeError: boom") for c in cases[:4]]
    ran = [Report("batchnorm", "t", c, PASS) for c in cases[4:]]
    assert narrowing_hint("batchnorm", raised + ran) is None  # (every factor's levels meet on both sides)
    assert narrowing_hint("batchnorm", ran) is None


def test_a_case_may_keep_no_running_statistics_and_then_has_no_eval_mode():
    case = Case("batchnorm", (6, 3, 5), "f32", running_stats="none")
    assert case.record.required_of(case) == ("y", "dx", "dweight", "dbias") and "running-stats=none" in case.label
    report = compare("batchnorm", "torch", case)
    assert report.verdict == PASS and not {"running_mean", "running_var"} & {t.name for t in report.tensors}
    assert {"running_mean", "running_var"} <= {t.name for t in compare("batchnorm", "torch", case.with_(
        running_stats="yes")).tensors}
    with pytest.raises(ValueError, match="a layer that keeps none .--running-stats none. normalises with the batch"):
        case.with_(mode="eval")


def test_what_a_record_declares_narrows_even_once_the_probes_budget_is_spent(monkeypatch):
    """A slow implementation (a compiled one) spends the probes' seconds on its first cases; what its record declares
    costs no run and is read anyway: torch.compile's records declare order 1 only."""
    from normcheck.impls import limits
    from normcheck.ops import Impl
    import torch.nn.functional as F

    monkeypatch.setattr(limits, "PROBE_SECONDS", 0.0)
    impl = resolve_impl("layernorm", Impl("once", "layernorm", "order 1 only, by its record", F.layer_norm, orders=(1,)))
    narrowing = learned(get_op(impl.op), impl, DESIGN)
    assert {v for lim in narrowing.limits for v in lim.declines} == {2, "fwd", "fwd-rev"}
    assert all(lim.why == "once is only once differentiable (as recorded)" for lim in narrowing.limits)


class Answers:
    """An implementation as cases.probing asks it, with nothing run: `answer(case)` is a plain function's."""
    def __init__(self, answer, spent: bool = False):
        self.answer, self.spent = answer, spent


def test_probing_reads_limits_off_the_answers_alone():
    layernorm = get_op("layernorm")
    no_order_2 = Answers(lambda c: ("no double backward", {}, {}) if c.order == 2 else None)
    assert probed_narrowing(layernorm, DESIGN, no_order_2).limits == (
        Limit("order", declines=(2,), why="no double backward"),)
    # its usual case declined: the levels are probed from the first probe it runs (4-D)
    no_2d = probed_narrowing(layernorm, DESIGN, Answers(lambda c: ("no 2-D", {}, {}) if len(c.shape) == 2 else None))
    assert no_2d.limits == (Limit("rank", declines=(2,), why="no 2-D"),)
    # what the answer says it takes wins over the level its probe changed, even once nothing more may run
    f32_only = ("f32 only", {"dtype": (("f32", "f32"),)}, {})
    for spent in (False, True):
        takes = probed_narrowing(layernorm, DESIGN, Answers(lambda c: None if c.dtype == "f32" else f32_only, spent))
        assert takes.limits == (Limit("dtype", takes=(("f32", "f32"),), why="f32 only"),)
    # the run's --dtype f64 leaves it nothing it runs: probed outside the run's fields, each other level is declined
    f64 = Narrowing.of({"dtype": "f64"}, scans="without")
    declined = probed_narrowing(layernorm, f64, Answers(lambda c: None if c.dtype == "f32" else ("f32 only", {}, {})))
    assert {v for lim in declined.limits for v in lim.declines} == {
        v for f in narrowed_design("layernorm")[0] if f.name == "dtype" for v in f.values} - {("f32", "f32")}
