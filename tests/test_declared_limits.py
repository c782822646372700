"""Declared limits are SKIPs (issue 37): a function that raises normcheck.Unsupported, in every world; a custom op
whose backward has no autograd of its own at order 2, and without a jvp in forward mode; a backward from saved
intermediates at fwd-rev, a FAIL unless it is marked @once_differentiable. Real torch, real worker processes."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from normcheck import WORLDS, Case, compare, resolve_impl
from normcheck.cli import main
from normcheck.engine import FAIL, PASS, SKIP
from normcheck.engine.compare import judge
from tests import _declared_limits as limits
from tests.test_worlds import hosted  # (a world this machine cannot host is a skip saying why)

HERE = "tests._declared_limits"
ROOT = Path(__file__).resolve().parents[1]
F64, F32 = Case("rmsnorm", (4, 16), "f64"), Case("rmsnorm", (4, 16), "f32")
SPLIT = Case("syncbn", (8, 3, 5), "f64", split=(3, 2, 3))
# (the worlds of devices simulated by JAX and TensorFlow run those frameworks' code: not torch's Unsupported)
DISTRIBUTED = [w for w in WORLDS.values() if w.distributed and "torch" in w.frameworks]


@pytest.mark.parametrize("backend", ["isolated", "in-process"])
def test_a_function_that_raises_unsupported_is_a_skip_with_its_reason_in_both_single_process_worlds(backend):
    impl = resolve_impl("rmsnorm", limits.f32_only_rms_norm, backend=backend)
    assert impl.world == backend and impl.portable is not None  # (isolated: it runs in its worker process)
    assert judge(F32, impl).verdict == PASS  # (it runs the cases it takes)
    for order in (1, 2, "fwd", "fwd-rev"):
        report = judge(F64.with_(order=order), impl)
        assert report.verdict == SKIP and report.message == f"not supported: {limits.WHY_F32_ONLY}", report.summary()


def test_the_cli_shows_the_skip_row_and_a_run_that_tested_nothing_exits_2(capsys):
    out = io.StringIO()
    code = main(["compare", "--one-case", "--op", "rmsnorm", "--impl", f"{HERE}:f32_only_rms_norm", "--shape", "4,16",
                 "--dtype", "f64"], out)
    err = capsys.readouterr().err
    assert code == 2
    assert "SKIP" in out.getvalue() and f"not supported: {limits.WHY_F32_ONLY}" in out.getvalue()
    assert f"nothing was tested: all 1 cases were skipped (the first: {limits.WHY_F32_ONLY})" in err


@pytest.mark.parametrize("world", DISTRIBUTED, ids=lambda w: w.name)
def test_every_rank_declining_is_a_skip_and_one_rank_declining_a_failure_naming_it(world):
    report = compare("syncbn", resolve_impl("syncbn", f"{HERE}:declines_every_split", hosted(world), 10), SPLIT)
    assert report.verdict == SKIP and report.message == f"not supported: {limits.WHY_NO_SPLIT}", report.summary()
    report = compare("syncbn", resolve_impl("syncbn", f"{HERE}:declines_on_rank1", world.name, 10), SPLIT)
    assert report.verdict == FAIL
    assert report.message.startswith(f"rank 1: declined the case (not supported: {limits.WHY_NO_SPLIT})"), \
        report.message


def test_every_rank_declining_under_torchrun_is_a_skip_and_the_peers_stay_quiet():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "normcheck",
         "compare", "--one-case", "--op", "syncbn", "--backend", "env", "--impl", f"{HERE}:declines_every_split", "--split", "3,5",
         "--cases", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("SKIP", "PASS", "FAIL"))]
    assert len(rows) == 2 and all(r.startswith("SKIP") and f"not supported: {limits.WHY_NO_SPLIT}" in r for r in rows)
    assert "nothing was tested: all 2 cases were skipped" in proc.stderr  # (rank 0 exits 2)
    assert "[rank1]" not in proc.stderr, proc.stderr  # (rank 1 took both declines and returned, without a traceback)


def test_a_custom_op_whose_backward_has_no_autograd_is_judged_at_first_order_at_order_2_and_in_forward_mode():
    """Declined for its order alone, a case is judged as far as the implementation goes: y and every gradient at
    order 1, and the row says what was not judged and why."""
    assert resolve_impl("rmsnorm", limits.custom_op_rms_norm).portable is not None  # (it runs in a worker process)
    report = compare("rmsnorm", limits.custom_op_rms_norm, F64)
    assert report.verdict == PASS, report.summary()
    report = compare("rmsnorm", limits.custom_op_rms_norm, F64.with_(order=2))
    assert report.verdict == PASS and report.unjudged.startswith("order 2 (only once differentiable")
    assert "normcheck_tests.rms_norm_bwd.default but no autograd formula was registered" in report.unjudged
    assert report.case.order == 2 and report.judged_case.order == 1
    assert {t.name for t in report.tensors} == {"y", "dx", "dweight"}
    for order in ("fwd", "fwd-rev"):  # (no jvp: at fwd too, where no input would require grad but for the adapter)
        report = compare("rmsnorm", limits.custom_op_rms_norm, F64.with_(order=order))
        assert report.verdict == PASS and report.unjudged.startswith(f"order {order} (no forward-mode derivative")
        assert "not judged: order" in report.summary() and not any(t.name.startswith("jvp") for t in report.tensors)


def test_a_backward_from_saved_intermediates_fails_at_fwd_rev_unless_it_is_marked_once_differentiable():
    for fn in (limits.saved_stats_rms_norm, limits.once_saved_stats_rms_norm):  # (right where they claim to be)
        assert {compare("rmsnorm", fn, F64.with_(order=order)).verdict for order in (1, "fwd")} == {PASS}
    report = compare("rmsnorm", limits.saved_stats_rms_norm, F64.with_(order="fwd-rev"))
    assert report.verdict == FAIL and report.tensor("jvp_dweight").all_zero, report.summary()
    assert "dγ carries no tangent (taken as 0)" in report.message
    assert "its backward is computed outside forward-mode AD's reach" in report.message
    report = compare("rmsnorm", limits.once_saved_stats_rms_norm, F64.with_(order="fwd-rev"))
    assert report.verdict == PASS and report.judged_case.order == 1, report.summary()
    assert report.unjudged == ("order fwd-rev (no forward-mode derivative of its backward: dweight carries no tangent, "
                               "and OnceSavedStatsRMSNorm's backward is marked @once_differentiable)")


def test_a_missing_tangent_where_the_case_freezes_the_parameters_fails_on_dx():
    # (dx alone is asked for, along ddx: the saved x̂ and 1/rms carry no tangent, so dx carries none)
    report = compare("rmsnorm", limits.saved_stats_rms_norm, F64.with_(order="fwd-rev", frozen="params"))
    assert report.verdict == FAIL and "jvp_dx is 0 everywhere: dx carries no tangent (taken as 0)" in report.message
