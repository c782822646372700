"""Triton kernels judged on a CPU through Triton's interpreter (--triton-interpret): the project's own LayerNorm and
RMSNorm kernels (tests/_triton_kernels.py) pass their f32 sweep cases and every buggy variant fails one; the cases the
interpreter cannot run are SKIP rows; without the option a kernel fails in one clear line; the interpreter stays in
its own worker process."""
import importlib
import importlib.util
import io
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from normcheck import Case, Impl, compare
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import case_of, default_sweep, scan_rows
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.core.forkserver import start_early
from normcheck.engine import FAIL, MISTRUSTED, PASS, SKIP, judge
from normcheck.impls import bind, resolve_impl

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (pip install -e \".[triton]\")")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(),
                            reason="a GPU is visible: there Triton compiles the kernel instead of finding no driver")

KERNELS = "tests._triton_kernels"
CORRECT = {"layernorm": "triton_layer_norm", "rmsnorm": "triton_rms_norm"}
FORWARD, REDUCTION = {"y", "dx", "dweight", "dbias"}, {"dweight", "dbias"}  # what a bug there can corrupt
BUGGY = [  # (op, kernel, the outputs its bug can show in): a statistics bug shows in y, a reduction bug in no other
    ("layernorm", "layer_norm_tail_other_one", FORWARD),
    ("layernorm", "layer_norm_unmasked_variance", FORWARD),
    ("layernorm", "layer_norm_partials_reduced_once", REDUCTION),
    ("rmsnorm", "rms_norm_tail_other_one", FORWARD),
    ("rmsnorm", "rms_norm_partials_reduced_once", REDUCTION),
]
# The interpreter runs each program in Python: the sweep's cases up to this size take well under a second
SMALL = 100_000


def interpreted(op: str, kernel: str):
    return resolve_impl(op, f"{KERNELS}:{kernel}", triton_interpret=True)


def small_cases(op: str, impl, **fields):
    """The op's covering-design cases the interpreted implementation takes, up to SMALL elements, with `fields`."""
    return [c for c in default_sweep(op, narrowing=Narrowing(scans="without")) if math.prod(c.shape) <= SMALL
            and impl.unsupported(c) is None and all(getattr(c, k) == v for k, v in fields.items())]


def run(*argv):
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


# The scans' sizes at the kernels' own widths: next_power_of_2(H) columns, row tiles of powers of two
AROUND = {w + d for w in (16, 64, 256, 1024) for d in (-1, 0, 1)}


@needs_triton
@pytest.mark.parametrize("op", CORRECT)
def test_the_correct_kernels_pass_the_boundary_scans_around_their_block_widths(op):
    impl = interpreted(op, CORRECT[op])
    cases = [c for name, size, row in scan_rows(op) if size in AROUND
             for c in [case_of(op, row)] if c.dtype == "f32" and c.numel <= SMALL and impl.unsupported(c) is None]
    reports = [judge(c, impl) for c in cases]
    assert len(reports) >= 12 and all(r.verdict in (PASS, MISTRUSTED) for r in reports), \
        [r.summary() for r in reports if r.verdict not in (PASS, MISTRUSTED)]


@needs_triton
@pytest.mark.parametrize("op", CORRECT)
def test_the_correct_kernels_pass_their_f32_sweep_cases(op):
    impl = interpreted(op, CORRECT[op])
    reports = [judge(c, impl) for c in small_cases(op, impl, dtype="f32", order=1)]
    judged = [r for r in reports if r.verdict in (PASS, MISTRUSTED)]  # (MISTRUSTED: passed, a tensor all but zero)
    assert len(reports) >= 4 and judged == reports, [r.summary() for r in reports if r not in judged]
    assert any(r.verdict == PASS for r in reports)


@needs_triton
@pytest.mark.parametrize("op, kernel, shows_in", BUGGY, ids=[k for _, k, _ in BUGGY])
def test_each_buggy_kernel_fails_a_sweep_case_the_correct_one_passes(op, kernel, shows_in):
    impl = interpreted(op, kernel)
    failed = next((r for c in small_cases(op, impl, order=1) if (r := judge(c, impl)).verdict == FAIL), None)
    assert failed is not None, f"{kernel} passed every small sweep case"
    failing = {t.name for t in failed.tensors if t.verdict == FAIL}
    assert failing <= shows_in and ("y" in failing or shows_in == REDUCTION), failed.summary()
    # the bug's failure, not the interpreter's: the correct kernel passes the case
    assert judge(failed.case, interpreted(op, CORRECT[op])).verdict in (PASS, MISTRUSTED)


@needs_triton
def test_the_cli_judges_a_triton_kernel_in_the_interpreter():
    # (docs/usage.md's sample runs the same spelling as a command of its own: tests/test_readme.py)
    code, text = run("compare", "--one-case", "--op", "layernorm", "--device", "cpu", "--impl", f"{KERNELS}:triton_layer_norm",
                     "--triton-interpret", "--shape", "3,5,17", "--normalized-dims", "2", "--memory-format", "strided",
                     "--cases", "2", "--json")
    doc = json.loads(text)
    assert code == 0 and doc["triton_interpret"] is True and [c["verdict"] for c in doc["cases"]] == ["PASS", "PASS"]
    assert all(c["replay"].endswith("--triton-interpret") for c in doc["cases"])
    assert "TRITON_INTERPRET" not in os.environ


@needs_triton
@no_gpu
def test_without_the_interpreter_a_triton_kernel_fails_in_one_clear_line():
    case = Case("rmsnorm", (7, 17), "f32")
    assert compare("rmsnorm", f"{KERNELS}:triton_rms_norm", case, triton_interpret=True).verdict == PASS
    # next, the same kernel in an ordinary worker: nothing of the interpreter is left in this process or the fork server
    report = compare("rmsnorm", f"{KERNELS}:triton_rms_norm", case)
    assert report.verdict == FAIL and "\n" not in report.message
    assert report.message.startswith("launched a Triton kernel (at _triton_kernels.py:") and \
        report.message.endswith("judge it on the CPU with --triton-interpret (Triton's interpreter), or on a GPU with "
                                "--device cuda"), report.message
    assert "TRITON_INTERPRET" not in os.environ


@needs_triton
def test_cases_the_interpreter_cannot_run_are_skip_rows():
    impl = interpreted("layernorm", "triton_layer_norm")
    for param_dtype in ("bf16", "f32"):  # bf16, and mixed-bf16
        report = judge(Case("layernorm", (7, 17), "bf16", param_dtype), impl)
        assert report.verdict == SKIP and "Triton's interpreter (triton " in report.message \
            and "holds bf16 values as raw bits" in report.message, report.message
    fp8 = judge(Case("layernorm", (7, 17), "f32", fp8="e4m3"), resolve_impl(
        "layernorm", "torch-fp8-e4m3", triton_interpret=True))
    assert fp8.verdict == SKIP and "rounds wrongly when it converts to fp8" in fp8.message
    assert judge(Case("layernorm", (7, 17), "f16", "f32"), impl).verdict == PASS  # f16 arithmetic is NumPy's there


@needs_triton
def test_the_interpreter_adds_to_a_records_own_support_rule_and_binding_again_removes_it():
    record = Impl("no-f16", "layernorm", "a record that refuses f16 cases", f"{KERNELS}:triton_layer_norm",
                  supports=lambda case: "no f16" if case.dtype == "f16" else None)
    bound = resolve_impl("layernorm", record, triton_interpret=True)
    assert bound.unsupported(Case("layernorm", (2, 3), "f16")) == "no f16"
    assert "holds bf16 values as raw bits" in bound.unsupported(Case("layernorm", (2, 3), "bf16"))
    assert bound.unsupported(Case("layernorm", (2, 3), "f32")) is None
    rebound = bind(bound)
    assert not rebound.triton_interpret and rebound.supports is record.supports
    assert rebound.unsupported(Case("layernorm", (2, 3), "bf16")) is None


@pytest.mark.parametrize("argv, message", [
    (["--op", "layernorm", "--impl", "baseline"], "--triton-interpret: baseline is a NumPy implementation; Triton "
                                                  "kernels are torch code"),
    (["--op", "syncbn"], "--triton-interpret runs a single-process op's implementation in the isolated world's worker "
                         "process, not the ranks of the gloo world"),
])
@needs_triton
def test_where_the_interpreter_cannot_go_is_one_line_exit_2(argv, message, capsys):
    assert run("compare", *argv, "--triton-interpret")[0] == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err == f"normcheck: error: {message}", err


@needs_triton
def test_an_implementation_that_would_run_in_this_process_is_refused():
    with pytest.raises(UsageError, match=r"^--triton-interpret runs .* not the in-process world$"):
        resolve_impl("layernorm", f"{KERNELS}:triton_layer_norm", "in-process", triton_interpret=True)
    with pytest.raises(UsageError, match=r"^--triton-interpret: .* does not pickle .* \(define it at module level\)$"):
        resolve_impl("layernorm", lambda x, shape, w, b, eps: x, triton_interpret=True)


@pytest.fixture
def triton_imported():
    """triton imported before pytester's snapshot of sys.modules: the modules a run there imports are dropped after
    it, and triton's bindings complain at exit of modules dropped unreleased."""
    importlib.import_module(KERNELS)


@needs_triton
def test_the_pytest_plugin_runs_the_sweep_in_the_interpreter(triton_imported, pytester, monkeypatch):
    with monkeypatch.context() as here:  # the fork server imports from the directory it starts in: this checkout's
        here.chdir(ROOT)
        start_early()
    # the small f32 cases of one shape, on normal data (what the interpreter cannot run narrows the rest away)
    result = pytester.runpytest_inprocess("--normcheck-op", "rmsnorm", "--normcheck-impl", f"{KERNELS}:triton_rms_norm",
                                          "--normcheck-triton-interpret", "--normcheck-shape", "4,33", "--normcheck-dtype",
                                          "f32", "--normcheck-order", "1", "--normcheck-scans", "without",
                                          "-k", "test_default_sweep and normal and contiguous")
    assert result.ret == 0 and "Triton's interpreter, hypothesis profile" in result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) >= 1 and not result.parseoutcomes().get("failed")


def test_without_triton_the_option_is_one_line_naming_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "triton", None)  # (a None entry: `import triton` fails, find_spec finds nothing)
    assert run("compare", "--op", "layernorm", "--triton-interpret")[0] == 2
    err = capsys.readouterr().err.strip()
    assert err == 'normcheck: error: --triton-interpret needs triton: pip install -e ".[triton]" (or pip install ' \
                  '"normcheck[triton]")'


@needs_triton
def test_a_case_past_its_limit_in_the_interpreter_is_no_verdict_on_the_kernel():
    code, out = run("compare", "--one-case", "--op", "layernorm", "--impl", f"{KERNELS}:waits_for_other_programs",
                    "--triton-interpret", "--timeout", "1", "--shape", "2,8")
    row = out.splitlines()[0]
    assert code == 2 and row.startswith("SKIP"), out  # (every case skipped: nothing tested)
    assert "timed out after 1 s" in row and "Triton's interpreter runs a grid's programs one after another" in row
