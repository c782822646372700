"""Single-process implementations run isolated: one that hangs or kills its process becomes a failing
row and the run goes on in a fresh worker; what they raise comes back with its stack; code that
cannot reach another process runs here. And the per-case limit that stops them follows the run."""
from __future__ import annotations

import io
import json
import multiprocessing
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normcheck import Case, compare, resolve_impl
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.engine import FAIL, MISTRUSTED, PASS, SKIP, judge
from normcheck.worlds import CaseLimit
from normcheck.core.errors import CaseTimeout
from normcheck.engine.compare import reference_seconds
from normcheck.worlds import limits, workers
from normcheck.worlds.limits import DEFAULT_TIMEOUT, FLOOR, MULTIPLE, STUCK_AFTER
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep

ROOT = Path(__file__).resolve().parents[1]
FAULTS = "tests._solo_faults"
F32 = Case("batchnorm", (4, 3, 5, 5))
BF16 = Case("batchnorm", (4, 3, 5, 5), dtype="bf16")
F16 = Case("batchnorm", (4, 3, 5, 5), dtype="f16")


def test_a_hanging_implementation_times_out_and_the_next_case_runs_in_a_fresh_worker():
    impl = resolve_impl("batchnorm", f"{FAULTS}:hangs_on_bf16", timeout=2)
    start = time.monotonic()
    hung = compare("batchnorm", impl, BF16)
    assert time.monotonic() - start < 8
    assert hung.verdict == FAIL
    assert hung.message.startswith("timed out after 2 s at _solo_faults.py:"), hung.message
    assert "in hangs_on_bf16" in hung.message and hung.time_limit == 2
    assert compare("batchnorm", impl, F32).verdict == PASS


def test_a_message_between_processes_keeps_every_array_bit_for_bit_and_writable():
    """Arrays travel out of band, each in a frame of its own: large ones (beyond a pipe's buffer), strided and
    Fortran-ordered ones, empty ones and NaN payloads arrive as they left, writable like any unpickled array."""
    rng = np.random.default_rng(0)
    nan_payload = np.array([0x7FF8_0000_0000_0001, 0xFFF0_0000_0000_0000], dtype=np.uint64).view(np.float64)
    sent = {"large": rng.standard_normal((513, 1031)), "strided": rng.standard_normal((9, 12))[::2, ::3],
            "fortran": np.asfortranarray(rng.standard_normal((5, 7))), "empty": np.zeros((0, 16)),
            "mask": rng.random(17) < 0.5, "nan": nan_payload, "f16": rng.standard_normal(33).astype(np.float16),
            "text": "and plain objects", "nested": (np.arange(5), [np.ones(3)])}
    here, there = multiprocessing.Pipe()
    sender = threading.Thread(target=workers._send, args=(here, sent))  # (a large message fills the pipe first)
    sender.start()
    got = workers._recv(there)
    sender.join()
    assert got["text"] == sent["text"] and set(got) == set(sent)
    for name in ("large", "strided", "fortran", "empty", "mask", "nan", "f16"):
        a, b = sent[name], got[name]
        assert b.dtype == a.dtype and b.shape == a.shape and b.flags.writeable, name
        assert a.tobytes() == b.tobytes(), name
    assert np.array_equal(got["nested"][0], np.arange(5)) and np.array_equal(got["nested"][1][0], np.ones(3))


@pytest.mark.parametrize("fn, died", [("exits_on_f16", "died (exit code 3)"),
                                      ("aborts_on_f16", "died (exit code -6, SIGABRT)")])
def test_an_implementation_that_kills_its_process_is_a_failing_row(fn, died):
    impl = resolve_impl("batchnorm", f"{FAULTS}:{fn}")
    report = compare("batchnorm", impl, F16)
    assert report.verdict == FAIL and report.message.startswith(died), report.message
    assert compare("batchnorm", impl, F32).verdict == PASS


def test_what_an_isolated_implementation_raises_comes_back_with_its_stack():
    report = compare("batchnorm", f"{FAULTS}:raises_on_f16", F16)
    assert report.verdict == FAIL
    assert report.message.startswith("raised NotImplementedError: no f16 kernel (at _solo_faults.py:"), report.message
    assert "Traceback" in report.traceback and "raises_on_f16" in report.traceback


def test_code_that_cannot_reach_another_process_runs_here():
    impl = resolve_impl("batchnorm", lambda *args: F.batch_norm(*args))
    assert impl.world == "isolated" and impl.portable is None
    assert compare("batchnorm", impl, F32).verdict == PASS


def test_a_registered_record_travels_by_name_and_a_user_function_as_itself():
    assert resolve_impl("groupnorm", "cl-auto-t2").portable().name == "cl-auto-t2"
    travelled = resolve_impl("batchnorm", f"{FAULTS}:slow").portable()
    assert travelled.impl.target == f"{FAULTS}:slow" and travelled.impl.known_issues == ()


def test_a_script_without_the_main_guard_runs_once(tmp_path):
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from normcheck import Case, compare
        print("ran", compare("batchnorm", "tests._solo_faults:exits_on_f16", Case("batchnorm", (4, 3, 5))).verdict)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ran", "PASS"]


def test_the_cli_reports_a_dying_implementation_and_goes_on(capsys):
    out = io.StringIO()  # (the CLI's main in this process: its workers die, not the process that judges)
    code = main(["compare", "--op", "batchnorm", "--impl", f"{FAULTS}:exits_on_f16", "--json", "--scans", "without"],
                out)  # (it dies on f16: the design's)
    assert code == 1, capsys.readouterr().err
    document = json.loads(out.getvalue())
    failed = [c for c in document["cases"] if c["verdict"] == FAIL]
    died = [c for c in failed if c["message"].startswith("died")]
    assert died and all(c["case"]["dtype"] == "f16" and c["message"] == "died (exit code 3)" for c in died)
    # and nothing else fails: it calls F.batch_norm, whose gradients are wrong where x's size-1 dims' strides suggest
    # another format than dy's (torch-bn-size1-strides), KNOWN there as in torch's own record, which fails those cases
    # alike (the same kernel, the same case: one verdict)
    assert failed == died
    size1 = [c for c in document["cases"] if c["case"]["x_format"] == "channels_last_size1" and c not in died
             and c["message"].startswith("known issue torch-bn-size1-strides")]
    assert size1 and all(c["verdict"] == "KNOWN" for c in size1)
    total = len(default_sweep("batchnorm", narrowing=Narrowing(scans="without")))
    passed = document["summary"]["pass"] + document["summary"]["mistrusted"]
    assert document["summary"]["total"] == total and passed > total // 2
    assert document["time_limit"]["rule"] == "adaptive"
    assert document["cases"][0]["time_limit_s"] == DEFAULT_TIMEOUT


# --------------------------------------------------------------------------- the per-case limit
def test_a_stack_inside_torch_compile_or_a_build_reads_as_starting_up_and_a_users_loop_does_not():
    seen = []

    def backend(graph, example_inputs):  # (called by torch.compile while it compiles, inside torch._dynamo)
        seen.append(workers._describe_stack(sys._getframe())[2])
        return graph.forward

    torch.compile(lambda t: t * 2, backend=backend)(torch.ones(3))
    assert seen == [True]
    assert workers._describe_stack(sys._getframe())[2] is False


def test_the_first_case_keeps_its_start_up_allowance_only_while_it_is_starting_up(monkeypatch):
    # (the looks at 1.5 s and every 0.5 s after, for a build of 4 s; the defaults are 10 s and 2 s)
    monkeypatch.setattr(limits, "FIRST_LOOK", 1.5)
    monkeypatch.setattr(workers, "LOOK_AGAIN", 0.5)
    building = compare("batchnorm", resolve_impl("batchnorm", f"{FAULTS}:builds_on_first_call"), F32)
    assert building.verdict == PASS, building.message  # waiting for its compiler past the first look: starting up
    start = time.monotonic()
    hung = compare("batchnorm", resolve_impl("batchnorm", f"{FAULTS}:hangs_always"), F32)
    assert time.monotonic() - start < 15 and hung.time_limit == pytest.approx(1.5, abs=0.5)
    assert re.match(r"timed out after 1\.\d s at _solo_faults.py:", hung.message) and "in hangs_always" in hung.message
    assert "for the first case while it imports or compiles, 1.5 s otherwise" in hung.message, hung.message


def test_the_first_case_gets_the_default_then_the_limit_follows_the_slowest_finished_case():
    limit = CaseLimit()
    small, large = Case("batchnorm", (4, 3, 8)), Case("batchnorm", (4, 3, 80))
    assert limit.seconds(small) == DEFAULT_TIMEOUT and "for the first case while it imports or compiles" in limit.rule(small)
    limit.run(small, lambda timeout: time.sleep(0.01))
    assert limit.seconds(small) == FLOOR  # 20 × 0.01 s is below the floor
    limit.run(small, lambda timeout: time.sleep(0.2))
    assert MULTIPLE * 0.2 <= limit.seconds(small) < MULTIPLE * 0.3
    # ten times the elements of anything finished: the largest finished case's time, scaled up
    assert limit.seconds(large) >= 10 * limit.seconds(small) * 0.9
    assert "scaled up" in limit.rule(large)


def _times_out(seconds):
    raise CaseTimeout(f"timed out after {seconds:g} s")


def test_after_a_timeout_a_case_gets_its_yardstick_not_the_start_up_allowance():
    # nothing has finished, so nothing of the implementation is known: the float64 reference's time on the case
    # is the yardstick (here a stand-in of 0.5 s a case, and 4 s for a large case)
    limit = CaseLimit(yardstick=lambda case: 4.0 if case.shape[-1] > 10 else 0.5)
    small, large = Case("batchnorm", (4, 3, 8)), Case("batchnorm", (4, 3, 80))
    assert limit.seconds(small) == DEFAULT_TIMEOUT and limit.seconds(large) == MULTIPLE * 4.0  # start-up
    with pytest.raises(CaseTimeout, match=r"limit 60 s for the first case while it imports or compiles, 10 s otherwise"):
        limit.run(small, _times_out)
    assert limit.seconds(small) == MULTIPLE * 0.5 and limit.seconds(large) == MULTIPLE * 4.0
    assert "20 × the float64 reference's time on this case (0.5 s)" in limit.rule(small)
    limit.run(small, lambda timeout: time.sleep(0.01))  # once a case finished, the larger of the two
    assert limit.seconds(small) == MULTIPLE * 0.5


def test_the_default_yardstick_is_the_reference_time_of_that_case():
    limit, case = CaseLimit(), Case("layernorm", (64, 4096), normalized_dims=1)
    with pytest.raises(CaseTimeout):
        limit.run(F32, _times_out)
    assert limit.seconds(case) == max(FLOOR, MULTIPLE * reference_seconds(case)) and reference_seconds(case) > 0


def test_an_implementation_is_stuck_after_timeouts_with_nothing_finished_and_never_after_a_finish():
    limit, fixed, recovered = CaseLimit(yardstick=lambda c: 0.0), CaseLimit(5), CaseLimit(yardstick=lambda c: 0.0)
    recovered.run(F32, lambda timeout: None)
    for _ in range(STUCK_AFTER):
        assert not limit.stuck
        for each in (limit, fixed, recovered):
            with pytest.raises(CaseTimeout):
                each.run(F32, _times_out)
    assert limit.stuck.startswith(f"stopped: {STUCK_AFTER} cases timed out and none finished")
    assert not fixed.stuck and not recovered.stuck  # a fixed limit is the user's; a finished case is not stuck


def test_a_rank_that_always_hangs_is_stuck_though_one_rank_cases_finish_and_a_hang_at_one_size_is_not():
    """Timeouts are counted per rank (a SyncBN whose rank 1 always hangs ran every case, ~2 s each, since its world-size-1
    cases finished in between); a hang at one world size is one factor's value, whose neighbours finish."""
    from types import SimpleNamespace

    def world(size):
        return SimpleNamespace(shape=(4 * size, 3), split=(4,) * size)

    rank1, one_size = CaseLimit(yardstick=lambda c: 0.0), CaseLimit(yardstick=lambda c: 0.0)
    for limit in (rank1, one_size):
        limit.run(world(1), lambda timeout: None)
    for size in (2, 4):
        one_size.run(world(size), lambda timeout: None)
    for i in range(2 * STUCK_AFTER):
        assert not rank1.stuck or i == STUCK_AFTER
        if rank1.stuck:
            break
        for limit, size in ((rank1, 2 + i % 3), (one_size, 3)):
            with pytest.raises(CaseTimeout):
                limit.run(world(size), _times_out)
        rank1.run(world(1), lambda timeout: None)  # (the one-rank cases keep finishing)
    assert rank1.stuck.startswith(f"stopped: {STUCK_AFTER} cases with a rank 1 timed out and none with a rank 1 "
                                  "finished")
    assert not one_size.stuck  # (rank 2's cases of world size 4 finished)


def test_the_suite_fails_the_cases_after_a_stuck_implementation_without_running_them():
    from types import SimpleNamespace

    from normcheck.suite.test_normcheck_suite import check
    impl = resolve_impl("batchnorm", f"{FAULTS}:hangs_always")
    for _ in range(STUCK_AFTER):
        with pytest.raises(CaseTimeout):
            impl.limit.run(F32, _times_out)
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="not run: stopped: 10 cases timed out"):
        check(SimpleNamespace(bound=impl, backend=None, timeout=None, interrupted=False), F32)
    assert time.monotonic() - start < 1


def test_a_frameworks_import_is_part_of_the_load_step_not_of_the_first_case():
    # a fresh isolated worker imports JAX (seconds) before the clock starts: the first case passes under a limit
    # shorter than that start-up, and its own time is a fraction of its row's
    pytest.importorskip("jax", reason="needs the jax extra (pip install -e \".[jax]\")")
    impl = resolve_impl("layernorm", "tests._array_impls:jax_layer_norm", timeout=3, framework="jax")
    report = compare("layernorm", impl, Case("layernorm", (3, 4, 2, 3), normalized_dims=2, dtype="bf16"))
    assert report.verdict in (PASS, MISTRUSTED), report.summary()
    assert impl.limit.finished and impl.limit.longest < report.seconds / 2, (impl.limit.longest, report.seconds)


def test_scaling_from_a_tiny_case_is_capped_at_the_default():
    limit = CaseLimit()
    limit.run(Case("batchnorm", (2, 3)), lambda timeout: time.sleep(0.05))
    assert limit.seconds(Case("batchnorm", (16, 3, 64, 64))) == DEFAULT_TIMEOUT


def test_a_fixed_limit_ignores_what_was_measured():
    limit = CaseLimit(7)
    limit.run(F32, lambda timeout: None)
    assert limit.seconds(F32) == 7 and limit.rule(F32) == "" and limit.describe() == {"rule": "fixed", "seconds": 7}


@pytest.mark.parametrize("value", [0, -1, float("nan")])
def test_a_limit_must_be_positive(value):
    with pytest.raises(UsageError, match="must be > 0 seconds"):
        CaseLimit(value)


@pytest.mark.parametrize("unstarted, yardstick, says", [
    ("the worker was still reading the case in, before the implementation began", 0.0, "reading the case in"),
    (None, 0.01, "the float64 reference alone takes 0.01 s on"),
])
def test_a_fixed_limit_too_short_to_start_a_case_is_the_runs_error_not_a_verdict(unstarted, yardstick, says):
    # --timeout 0.001 FAILed torch's own kernel "timed out ... at <string>:1 in <module>" (the worker's bootstrap)
    def runs_out(timeout):
        raise CaseTimeout("timed out", timeout, unstarted)

    with pytest.raises(UsageError, match=f"^--timeout 0.001 s is too short to judge a case: it ran out while .*{says}"
                                         if unstarted else f"^--timeout 0.001 s is too short to judge a case: {says}"):
        CaseLimit(0.001, "--timeout", yardstick=lambda case: yardstick).run(F32, runs_out)
    # a limit the case could have met, which ran out inside the implementation: its timeout, a verdict
    with pytest.raises(CaseTimeout):
        CaseLimit(0.5, "--timeout", yardstick=lambda case: 0.001).run(
            F32, lambda timeout: (_ for _ in ()).throw(CaseTimeout("timed out at impl.py:3 in f", timeout)))


def test_torchs_kernel_under_a_millisecond_limit_is_one_line_exit_2(capsys):
    code = main(["compare", "--op", "layernorm", "--one-case", "--shape", "256,2048", "--timeout", "0.001"], io.StringIO())
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    # (the reference's ~20 ms on the case, or the worker still reading it in: whichever the limit met first)
    assert err.startswith("normcheck: error: --timeout 0.001 s is too short to judge a case: ") and \
        err.endswith("; give more seconds\n"), err


def test_a_slow_correct_implementation_is_not_cut():
    # 0.2 s a case over torch's time: the limit follows it (20 × 0.2 s), so nothing times out
    impl = resolve_impl("batchnorm", f"{FAULTS}:slow")
    cases = [Case("batchnorm", shape, dtype=dtype) for shape in ((2, 3), (8, 3, 16, 16), (16, 3, 32, 32))
             for dtype in ("f32", "bf16")]
    reports = [compare("batchnorm", impl, case) for case in cases]
    assert all(r.verdict in (PASS, MISTRUSTED) for r in reports), [r.summary() for r in reports]
    assert reports[-1].time_limit >= MULTIPLE * 0.2


def test_a_timeout_under_the_adaptive_limit_says_which_limit_applied():
    impl = resolve_impl("batchnorm", f"{FAULTS}:hangs_on_bf16")
    assert compare("batchnorm", impl, F32).verdict == PASS
    report = compare("batchnorm", impl, BF16)
    assert report.verdict == FAIL and report.time_limit == FLOOR
    # (20 × the longest finished case or the reference's time on this one, whichever is more: both are milliseconds)
    assert re.search(rf"\(limit {FLOOR:g} s: {MULTIPLE:g} × (the longest finished case|the float64 reference's time "
                     rf"on this case) \([0-9.e-]+ s\), at least {FLOOR:g} s; --timeout S sets one\)$", report.message), \
        report.message


def test_loading_the_implementation_is_outside_the_limit_also_after_a_restart():
    # a 2 s import under a 1 s limit: the worker imports it before the clock starts, and again in
    # the fresh worker that follows a hang
    impl = resolve_impl("batchnorm", "tests._slow_import:bn", timeout=1)
    assert compare("batchnorm", impl, F32).verdict == PASS
    hanging = resolve_impl("batchnorm", f"{FAULTS}:hangs_on_bf16", timeout=1)
    assert compare("batchnorm", hanging, BF16).verdict == FAIL  # the worker is killed and replaced
    assert compare("batchnorm", impl, F32).verdict == PASS


def test_a_worker_whose_parent_stopped_before_it_started_leaves_quietly(tmp_path, capfd):
    """A Ctrl-C while a world's workers start: the parent removes the directory their stderr files go to, and a worker
    starting after that returns at once (it printed a FileNotFoundError traceback on the user's terminal)."""
    from normcheck.worlds.workers import _worker_main

    assert _worker_main(0, 1, None, 1.0, None, None, str(tmp_path / "gone" / "rank0.stderr")) is None
    assert capfd.readouterr().err == ""


# --------------------------------------------------------------------------- the per-case memory limit
def test_a_case_past_its_memory_limit_is_a_skip_naming_memory(monkeypatch):
    """A 4-D-only layer given 2-D input broadcasts its (C,1,1) scale against (N,C) to (C,N,C): here 537 MB under a
    256 MiB limit (in the issue 89.6 GB, which woke the machine's out-of-memory killer). Its worker's allocation fails
    at once, a SKIP row that names memory, and the worker goes on: a correct layer passes the same case under the same
    limit. A limit that is no amount of memory is one usage line. (The layer broadcasts by indexing: one whose
    source writes its 4-D shape, reshape(1, -1, 1, 1), is declined on 2-D input before it runs.)"""
    monkeypatch.setenv("NORMCHECK_CASE_MEMORY", "256M")
    case = Case("batchnorm", (4096, 128), "f64", mode="eval")
    assert judge(case, resolve_impl("batchnorm", "torch.nn:BatchNorm1d", hints=False)).verdict == PASS
    report = judge(case, resolve_impl("batchnorm", "tests._layer_classes:UnsqueezedFrozenBatchNorm2d", hints=False))
    assert report.verdict == SKIP and "needs more memory than the case's limit (0.25 GiB" in report.message
    assert "it asked for 0.5 GiB (at _layer_classes.py" in report.message and report.seconds < 2, report.summary()
    assert judge(case, resolve_impl("batchnorm", "torch.nn:BatchNorm1d", hints=False)).verdict == PASS
    monkeypatch.setenv("NORMCHECK_CASE_MEMORY", "lots")
    with pytest.raises(UsageError, match="NORMCHECK_CASE_MEMORY='lots' is not an amount of memory"):
        compare("batchnorm", "torch.nn:BatchNorm1d", case)
