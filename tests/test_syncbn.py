"""SyncBN end to end in the lockstep world: recipes, expected failures, mutants, world errors."""
import re

import pytest
from hypothesis import given, settings

from normcheck import Case, compare, resolve_impl
from normcheck.core.errors import CaseTimeout
from normcheck.outputs.replay import report_replay as replay_command
from normcheck.engine import FAIL, PASS, SKIP
from normcheck.cases.strategies import cases
from normcheck.impls import worlds_of
from normcheck.kernels.syncbn.recipes import IMPLS as SYNCBN_RECIPES
from normcheck.worlds.lockstep import run_lockstep
from tests.mutants import syncbn as syncbn_mutants, syncbn_silu as silu_mutants

RECIPES = {r.name: r for r in SYNCBN_RECIPES}
LOCKSTEP_RECIPES = [name for name, r in RECIPES.items() if "lockstep" in worlds_of(r) and name != "pre15"]


def lockstep(name, timeout=10.0):
    return resolve_impl(RECIPES[name].op, name, "lockstep", timeout)


@pytest.mark.parametrize("name", LOCKSTEP_RECIPES)
def test_recipe_agrees_with_reference_across_worlds(name):
    impl = lockstep(name)
    # InplaceABN recomputes x̂ from the stored y, so y's rounding (divided by γ) enters dγ and dx:
    # at half precision that exceeds the budget by design (see the test below).
    dtypes = ("f64", "f32") if name == "inplace-abn" else ("f64", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16")

    op = RECIPES[name].op

    @settings(max_examples=25)
    @given(cases(op, dtypes=dtypes, max_world=6, max_numel=4096))
    def check(case):
        report = compare(op, impl, case)
        assert report.verdict != FAIL, f"{report.summary()}\n  replay: {replay_command(report)} --backend lockstep"

    check()


def test_large_worlds_and_many_empty_ranks():
    split = (0, 3) + (0,) * 30 + (2,) + (1,) * 30  # 64 ranks, 31 of them empty
    case = Case("syncbn", (sum(split), 3, 4), "f32", split=split)
    assert compare("syncbn", lockstep("torch19"), case).verdict == PASS


@pytest.mark.parametrize("split, fails", [((4, 4), False), ((2, 2, 2), False), ((3, 5), True), ((2, 0, 6), True)])
def test_pre15_fails_exactly_on_uneven_splits(split, fails):
    case = Case("syncbn", (sum(split), 3, 5, 7), "f32", split=split)
    report = compare("syncbn", lockstep("pre15"), case)
    assert (report.verdict == FAIL) == fails, report.summary()
    if fails:  # the global statistics are wrong, so the tensors built on them are named
        failing = {t.name for t in report.tensors if t.verdict == FAIL}
        assert failing & {"y", "dx", "running_mean", "running_var"}, report.summary()


def test_inplace_abn_loses_half_precision_activations_rounding_in_dweight():
    case = Case("syncbn", (8, 3, 5, 7), "bf16", "f32", split=(3, 5))
    report = compare("syncbn", lockstep("inplace-abn"), case)
    assert report.verdict == FAIL and report.worst.name in ("dweight", "dx")
    assert compare("syncbn", lockstep("torch19"), case).verdict == PASS


def test_inplace_abn_error_grows_as_gamma_shrinks():
    ratios = []
    for scale in (1.0, 1e-2, 1e-4):
        case = Case("syncbn", (8, 3, 5, 7), "f32", split=(3, 5), gamma_scale=scale)
        report = compare("syncbn", lockstep("inplace-abn"), case)
        ratios.append(max(report.tensor("dweight").max_ratio, report.tensor("dx").max_ratio))
    assert ratios[0] < ratios[1] < ratios[2]
    assert ratios[0] <= 1 < ratios[2]
    # The same data with γ at full scale passes through torch19: the growth is InplaceABN's.
    small = Case("syncbn", (8, 3, 5, 7), "f32", split=(3, 5), gamma_scale=1e-4)
    assert compare("syncbn", lockstep("torch19"), small).verdict == PASS


MUTANT_CASES = [
    ("mean_dy_over_world_size", Case("syncbn", (8, 3, 5, 7), "f64", split=(3, 5)), "dx"),
    ("param_grads_all_reduced", Case("syncbn", (8, 3, 5, 7), "f64", split=(3, 5)), "dweight"),
    ("biased_running_var", Case("syncbn", (8, 3, 5, 7), "f64", split=(3, 5)), "running_var"),
]


@pytest.mark.parametrize("bug, case, tensor", MUTANT_CASES, ids=[m[0] for m in MUTANT_CASES])
def test_syncbn_mutants_fail_on_the_named_tensor(bug, case, tensor):
    report = compare("syncbn", syncbn_mutants.MUTANTS[bug], case)
    assert report.verdict == FAIL and tensor in {t.name for t in report.tensors if t.verdict == FAIL}


def test_empty_rank_skipping_collectives_is_a_deadlock_found_at_once_not_a_timeout():
    impl = resolve_impl("syncbn", syncbn_mutants.MUTANTS["skip_collectives_when_empty"], "lockstep", timeout=60)
    report = compare("syncbn", impl, Case("syncbn", (8, 3, 4), "f32", split=(3, 0, 5)))
    assert report.verdict == FAIL
    assert report.message.startswith("rank 1: finished the case without joining a collective that ranks 0, 2 wait in "
                                     "(all_gather #1")
    assert report.seconds < 2  # not the 60 s timeout


def test_a_deadlock_in_the_gloo_world_names_the_implementations_line_and_one_rank_waits():
    impl = resolve_impl("syncbn", "tests._gloo_impls:skips_all_reduce_when_empty", "gloo", timeout=60)
    report = compare("syncbn", impl, Case("syncbn", (8, 3, 4), "f32", split=(3, 0, 5)))
    assert report.verdict == FAIL and report.seconds < 20, report.message  # (found at once, not the 60 s limit)
    assert report.message.startswith("rank 1: finished the case without joining a collective that ranks 0, 2 wait in "
                                     "(all_reduce at _gloo_impls.py:"), report.message  # (not normcheck's adapter)
    forward = resolve_impl("syncbn", "tests._gloo_impls:skips_all_gather_when_empty", "gloo", timeout=60)
    report = compare("syncbn", forward, Case("syncbn", (8, 3, 4), "f32", split=(3, 0, 5)))
    assert report.message.startswith("rank 1: finished the case without joining a collective that ranks 0, 2 wait in "
                                     "(all_gather at _gloo_impls.py:"), report.message
    alone = compare("syncbn", impl, Case("syncbn", (8, 3, 4), "f32", split=(8, 0)))
    assert alone.message.startswith("rank 1: finished the case without joining a collective that rank 0 waits in "
                                    "(all_reduce at _gloo_impls.py:"), alone.message


def test_count_in_the_wrong_dtype_is_rejected_by_the_primitive():
    report = compare("syncbn", syncbn_mutants.MUTANTS["count_in_input_dtype"],
                     Case("syncbn", (8, 3, 4), "bf16", "f32", split=(3, 5)))
    assert report.verdict == FAIL and re.match(r"ranks? 0(, 1)?: raised RuntimeError", report.message)
    assert "int32" in report.message


def test_wrong_shape_on_one_rank_is_named():
    def bad(x, w, b, rm, rv, eps, momentum, group, world_size):
        from normcheck.kernels.syncbn.recipes.torch19 import sync_batch_norm
        y = sync_batch_norm(x, w, b, rm, rv, eps, momentum, group, world_size)
        return y[:1] if group.rank() == 1 else y

    with pytest.raises(Exception, match=r"rank 1: y has shape \(1, 3, 4\), expected \(2, 3, 4\)"):
        run_lockstep(Case("syncbn", (6, 3, 4), split=(2, 2, 2)), bad, timeout=5)


def test_os_exit_on_a_lockstep_rank_is_a_failing_row_not_normcheck_gone():
    # (a rank is a thread of normcheck's process here: os._exit there ended the run silently, exit 4, no summary)
    import os

    from normcheck.worlds import lockstep
    from tests._world_faults import dies_on_rank1

    with pytest.raises(Exception, match=r"^rank 1: called os._exit\(3\): the implementation exits the process"):
        run_lockstep(Case("syncbn", (6, 3, 4), split=(2, 2, 2)), dies_on_rank1, timeout=5)
    with lockstep._EXIT_LOCK:  # (restored once no rank runs: a rank another test's run abandoned may still run)
        assert (os._exit is lockstep._REAL_EXIT) == (not lockstep._RANK_THREADS)


def test_a_rank_its_run_abandoned_keeps_os_exit_guarded_until_it_leaves():
    import os
    import threading

    from normcheck.worlds import lockstep
    from tests._world_faults import sleeps_on_rank1

    before = set(threading.enumerate())
    with pytest.raises(CaseTimeout):
        run_lockstep(Case("syncbn", (6, 3, 4), split=(2, 2, 2)), sleeps_on_rank1(2.0), timeout=0.3)
    abandoned = [t for t in threading.enumerate() if t not in before and t.name == "rank1"]
    assert abandoned and os._exit is not lockstep._REAL_EXIT  # (it may still call os._exit: a failure of its own)
    abandoned[0].join(10)
    assert not abandoned[0].is_alive() and os._exit is lockstep._REAL_EXIT


def test_master_worker_needs_the_lockstep_world():
    impl = resolve_impl("syncbn", "master-worker", "gloo")
    report = compare("syncbn", impl, Case("syncbn", (4, 3, 4), split=(2, 2)))
    assert report.verdict == SKIP and "lockstep" in report.message


def test_silu_bn_reference_composed_from_its_stage_matches_torch_float64_autograd():
    import numpy as np
    import torch
    import torch.nn.functional as F

    from normcheck import OPS

    case = Case("syncbn_silu", (6, 3, 5), "f64")
    i = case.make_inputs()
    out = OPS["syncbn_silu"].reference(i)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (i.x, i.weight, i.bias))
    tz = F.silu(F.batch_norm(tx, None, None, tw, tb, True, 0.1, case.eps))
    tz.backward(torch.tensor(i.dy))
    for name, theirs in (("y", tz), ("dx", tx.grad), ("dweight", tw.grad), ("dbias", tb.grad)):
        assert np.abs(out[name] - theirs.detach().numpy()).max() <= 1e-12 * np.abs(out[name]).max()


def test_fused_silu_recipe_passes_and_a_wrong_backward_fails():
    impl = resolve_impl("syncbn_silu", "fused-silu", "lockstep")
    for split in ((4,), (3, 0, 5)):
        for dtype, param in (("f64", "f64"), ("bf16", "f32")):
            case = Case("syncbn_silu", (sum(split), 3, 5, 7), dtype, param, split=split, profile="heavy_tailed")
            assert compare("syncbn_silu", impl, case).verdict == PASS
    wrong = resolve_impl("syncbn_silu", silu_mutants.silu_backward_skipped, "lockstep")
    report = compare("syncbn_silu", wrong, Case("syncbn_silu", (8, 3, 5, 7), "f32", split=(3, 5)))
    assert report.verdict == FAIL and report.worst.name == "dx"


def test_torchs_own_function_in_gloo_agrees_across_worlds():
    impl = resolve_impl("syncbn", "torch", "gloo", 30)

    @settings(max_examples=20)
    @given(cases("syncbn", max_world=4, max_numel=2048))
    def check(case):
        report = compare("syncbn", impl, case)  # KNOWN rows (torch's recorded issues) are allowed
        assert report.verdict != FAIL, f"{report.summary()}\n  replay: {replay_command(report)}"

    check()
