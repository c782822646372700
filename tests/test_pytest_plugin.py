"""The pytest plugin, as a user meets it: `pytest --normcheck-op ... --normcheck-impl ...` in a project
of their own (a temporary directory with nothing of normcheck's in it), in a real pytest process; what needs no
process of its own (collection, option errors, what a gate reports of the kernel it ran) in this one (pytester)."""
import io
import multiprocessing.forkserver  # noqa: F401 - kept across the in-process runs (the pytester fixture below)
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.core.disk_cache import cache_root

CACHE = cache_root()  # this process's disk cache, read before pytester points HOME elsewhere

# A correct BatchNorm (float64 inside, results rounded to the input's dtype) and the same with the
# classic momentum mix-up; the suite must pass the first and fail the second with replay lines.
MYBN = '''
import torch
import torch.nn.functional as F

def bn(x, running_mean, running_var, weight, bias, training, momentum, eps):
    rm, rv = running_mean.to(torch.float64, copy=True), running_var.to(torch.float64, copy=True)
    up = lambda t: None if t is None else t.double()
    y = F.batch_norm(x.double(), rm, rv, up(weight), up(bias), training, momentum, eps)
    with torch.no_grad():
        running_mean.copy_(rm)
        running_var.copy_(rv)
    return y.to(x.dtype)

def bn_momentum_swapped(x, running_mean, running_var, weight, bias, training, momentum, eps):
    return bn(x, running_mean, running_var, weight, bias, training, 1 - momentum, eps)
'''

# The user's own tests, written with the plugin's fixtures.
TEST_MINE = '''
from mybn import bn, bn_momentum_swapped

def test_mine_passes(normcheck_case, normcheck_compare):
    report = normcheck_compare(bn, normcheck_case((8, 3, 5), dtype="bf16", x_format="strided"))
    assert report.verdict == "PASS"

def test_mine_fails(normcheck_case, normcheck_compare):
    normcheck_compare(bn_momentum_swapped, normcheck_case((8, 3, 5), op="batchnorm"))

def test_mine_from_a_token(normcheck_case):
    assert normcheck_case("TOKEN").shape == (2, 3, 4)
'''


def pytest_in(project: Path, *args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=timeout)


def outcomes(junit: Path) -> dict[str, str]:
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        child = next(iter(case), None)
        result[case.get("name")] = "passed" if child is None or child.tag == "system-out" else child.tag
    return result


@pytest.fixture
def pytester(pytester, monkeypatch):
    """pytester, its in-process runs sharing what a user's runs on one machine share: the disk cache of built covering
    arrays (pytester's HOME is an empty folder) and the workers' fork server (each run forgets the modules it imported:
    multiprocessing.forkserver, imported above, stays, and the server with it, not a new one and its torch import
    for each run)."""
    monkeypatch.setenv("NORMCHECK_CACHE", str(CACHE))
    return pytester


def gate_here(pytester, *args):
    """A gated run in this process, for what needs no pytest process of its own."""
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def replay_here(project: Path, argv: list[str], monkeypatch) -> tuple[int, str]:
    """`normcheck ARGV` run from the user's directory by the CLI's main in this process (as tests/test_cli.py
    replays): it imports the user's module from there (core.loading), here into a copy of sys.path."""
    from normcheck.cli import main

    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = io.StringIO()
    try:
        return main(argv, out), out.getvalue()
    finally:  # (forget the user's module: another directory may have one of that name)
        sys.modules.pop(argv[argv.index("--impl") + 1].split(":")[0], None)


@pytest.fixture
def project(tmp_path):
    from normcheck import Case
    from normcheck.cases.tokens import encode_case

    (tmp_path / "mybn.py").write_text(MYBN)
    (tmp_path / "test_mine.py").write_text(TEST_MINE.replace("TOKEN", encode_case(Case("batchnorm", (2, 3, 4)))))
    return tmp_path


def test_the_suite_runs_beside_the_users_tests_and_passes_a_correct_kernel(project, monkeypatch):
    proc = pytest_in(project, "--normcheck-op", "batchnorm", "--normcheck-impl", "mybn:bn", "--normcheck-scans", "without",
                     f"--junitxml={project / 'out.xml'}")  # (tests/test_narrowing.py collects the scans through it)
    results = outcomes(project / "out.xml")
    sweep = [n for n in results if n.startswith("test_default_sweep[")]
    assert len(sweep) == len(default_sweep("batchnorm", narrowing=Narrowing(scans="without")))
    # It calls F.batch_norm, so torch's double backward of a bias without a weight is its known issue there (xfail),
    # and so are F.batch_norm's wrong gradients where x's size-1 dims' strides suggest another format than dy's
    # (torch-bn-size1-strides: torch's own record fails those cases alike, or comparably)
    known = [n for n in sweep if results[n] != "passed"]
    size1 = [n for n in known if "channels_last_size1" in n]
    assert size1 and all(results[n] == "skipped" for n in size1), [(n, results[n]) for n in size1]
    assert all(results[n] == "skipped" and "bias-only" in n and "order=2" in n for n in known if n not in size1), {
        n: results[n] for n in known if n not in size1}
    bias_only_order_2 = [c for c in default_sweep("batchnorm", narrowing=Narrowing(scans="without"))
                         if c.affine == "bias" and c.order == 2 and c.x_format != "channels_last_size1"]
    assert len(known) - len(size1) <= len(bias_only_order_2) < len(sweep) // 10
    assert results["test_generated_cases"] == "passed"
    assert "normcheck: batchnorm / mybn:bn, hypothesis profile ci" in proc.stdout
    # The fixtures: the user's own tests ran, and the failing one says how to replay its case ...
    assert results["test_mine_passes"] == results["test_mine_from_a_token"] == "passed"
    assert results["test_mine_fails"] == "failure" and proc.returncode == 1
    replay = next(line for line in proc.stdout.splitlines() if line.startswith("replay: "))
    assert replay.startswith("replay: normcheck compare --op batchnorm --impl mybn:bn_momentum_swapped --case v3.")
    # ... and that line, run from the user's directory, fails the same case again.
    code, printed = replay_here(project, replay.split()[2:], monkeypatch)
    assert code == 1 and printed.startswith("FAIL") and "8x3x5 f32 contiguous normal" in printed
    assert "running_mean" in printed or "running_var" in printed


def test_a_users_syncbn_passes_in_gloo_workers_started_from_the_users_directory(tmp_path):
    (tmp_path / "mysync.py").write_text("from normcheck.kernels.syncbn.recipes.torch19 import sync_batch_norm\n")
    proc = pytest_in(tmp_path, "-q", "--normcheck-op", "syncbn", "--normcheck-impl", "mysync:sync_batch_norm")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{len(default_sweep('syncbn')) + 2} passed" in proc.stdout


def test_a_generated_syncbn_failure_is_shrunk_and_replayable(pytester):
    (pytester.path / "mysync.py").write_text((Path(__file__).parent / "mutants" / "syncbn.py").read_text())
    result = gate_here(pytester, "--normcheck-op", "syncbn", "--normcheck-impl", "mysync:mean_dy_over_world_size",
                       "--normcheck-backend", "lockstep", "-k", "generated")  # (its ranks are threads of this process)
    assert result.ret == 1
    replay = next(line for line in result.outlines if line.startswith("replay: "))
    assert replay.endswith("--backend lockstep") and "dx on rank" in result.stdout.str()
    from normcheck.cases.tokens import decode_case

    case = decode_case(replay.split("--case ")[1].split()[0])
    assert 2 <= len(case.split) and case.shape[0] <= 4  # hypothesis shrank it to a small world


# In-process pytest runs (pytester) for what needs no separate process: collection, option errors, and what a gate
# reports of the kernel it ran.

@pytest.mark.parametrize("op", ["batchnorm", "groupnorm", "syncbn", "syncbn_silu"])
def test_every_op_collects_its_sweep_and_the_property(pytester, op):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", op)
    tests = [line for line in result.outlines if "::" in line]
    assert result.ret == 0 and len(tests) == len(default_sweep(op)) + 2
    assert tests[-2].endswith("::test_generated_cases") and tests[-1].endswith("::test_something_was_tested")


def test_path_options_put_every_sweep_case_on_that_path(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "batchnorm", "--normcheck-mode",
                                          "eval", "--normcheck-frozen", "x", "--normcheck-order", "2")
    sweep = [line for line in result.outlines if "::test_default_sweep[" in line]
    narrowed = default_sweep("batchnorm", narrowing=Narrowing.of({"mode": "eval", "frozen": "x", "order": 2}))
    assert result.ret == 0 and len(sweep) == len(narrowed) > 20
    assert all(" eval frozen-x order=2 " in line for line in sweep)


def test_fixing_and_convention_options_reach_every_sweep_case(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "layernorm", "--normcheck-eps",
                                          "0.01", "--normcheck-affine", "weight", "--normcheck-output-dtype", "promote",
                                          "--normcheck-compute-dtype", "f32")
    sweep = [line for line in result.outlines if "::test_default_sweep[" in line]
    narrowed = Narrowing.of({"eps": 0.01, "affine": "weight", "output_dtype": "promote", "compute_dtype": "f32"})
    assert result.ret == 0 and len(sweep) == len(default_sweep("layernorm", narrowing=narrowed))
    assert all(" eps=0.01 " in line and " weight-only" in line and " out=promote compute=f32 " in line
               for line in sweep), sweep[:3]


def test_a_convention_the_implementation_does_not_follow_is_refused(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "rmsnorm", "--normcheck-casting",
                                          "before-weight")
    assert result.ret != 0
    assert "--normcheck-casting before-weight: torch follows casting=end" in "\n".join(result.errlines)


def test_without_normcheck_op_the_plugin_adds_nothing(pytester):
    pytester.makepyfile(test_theirs="def test_one():\n    pass\n")
    suite = Path(__import__("normcheck").__file__).parent / "suite"
    result = pytester.runpytest_inprocess("--collect-only", "-q", ".", str(suite))  # even when pointed at it
    assert [line for line in result.outlines if "::" in line] == ["test_theirs.py::test_one"]


@pytest.mark.parametrize("args, message", [
    (["--normcheck-op", "rmsnorm2"], "--normcheck-op 'rmsnorm2' is not an op; choose one of batchnorm"),
    (["--normcheck-op", "syncbn", "--normcheck-impl", "no_such_module:fn"],
     "--normcheck-impl no_such_module:fn: cannot import no_such_module: ModuleNotFoundError: No module named"),
    (["--normcheck-op", "batchnorm", "--normcheck-impl", "json:nothing"], "json has no attribute nothing"),
    (["--normcheck-op", "batchnorm", "--normcheck-profile", "fast"], "--normcheck-profile 'fast'"),
    (["--normcheck-op", "groupnorm", "--normcheck-backend", "gloo"], "applies to syncbn, syncbn_silu, layernorm_sp"),
    (["--normcheck-op", "syncbn", "--normcheck-backend", "env"], "use `normcheck compare --backend env`"),
    (["--normcheck-impl", "mybn:bn"], "--normcheck-impl needs --normcheck-op"),
    (["--normcheck-op", "groupnorm", "--normcheck-mode", "eval"], "--mode eval applies to the ops with running statistics"),
    (["--normcheck-op", "batchnorm", "--normcheck-order", "3"], "order must be one of 1, 2, fwd, fwd-rev"),
    (["--normcheck-op", "batchnorm", "--normcheck-frozen", "gamma"], "unknown frozen 'gamma'"),
    (["--normcheck-op", "layernorm", "--normcheck-impl", "json:dumps", "--normcheck-framework", "mxnet"],
     "unknown framework 'mxnet'; choose one of torch, numpy, jax, tf"),
    (["--normcheck-framework", "jax"], "--normcheck-framework needs --normcheck-op"),
    (["--normcheck-device", "cpu"], "--normcheck-device needs --normcheck-op"),
    (["--normcheck-triton-interpret"], "--normcheck-triton-interpret needs --normcheck-op"),
    (["--normcheck-op", "layernorm", "--normcheck-device", "gpu0"], "--normcheck-device gpu0: not a device torch names"),
])
def test_bad_options_are_one_line_usage_errors(pytester, args, message):
    result = pytester.runpytest_inprocess(*args)
    errors = [line for line in result.errlines if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR and len(errors) == 1
    assert errors[0].startswith("ERROR: ") and message in errors[0]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is visible: the error cannot happen")
def test_a_device_this_torch_lacks_is_a_one_line_usage_error(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "layernorm", "--normcheck-device",
                                          "cuda")
    errors = [line for line in result.errlines if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR and len(errors) == 1, errors
    assert errors[0].startswith("ERROR: --normcheck-device cuda: this torch (") and "has no CUDA device" in errors[0]


def test_a_gate_that_tested_nothing_fails(pytester):
    # torch's SyncBatchNorm Function runs in gloo or env worlds only: in the lockstep world every case skips
    result = gate_here(pytester, "--normcheck-op", "syncbn", "--normcheck-impl", "torch", "--normcheck-backend",
                       "lockstep", "-k", "sweep or tested")
    assert result.ret == 1
    assert (f"nothing was tested: all {len(default_sweep('syncbn'))} cases of the default sweep were skipped by torch"
            in result.stdout.str())


def test_the_batch_invariance_check_reaches_the_gate(pytester):
    """--normcheck-check batch-invariance: a kernel whose reduction order follows the batch fails the gated sweep."""
    result = gate_here(pytester, "-q", "-x", "--normcheck-op", "rmsnorm", "--normcheck-impl",
                       "tests._batch_variant:split_k_below_16_rows", "--normcheck-check", "batch-invariance",
                       "-k", "sweep and f64 and contiguous")
    assert result.ret == 1 and "not batch invariant" in result.stdout.str(), result.stdout.str()[-2000:]


# A user's kernels, as tests/_limited_impls.py writes them: a once-differentiable LayerNorm without a jvp, and a
# BatchNorm for 4-D input only (it raises on any other rank)
LIMITED = (Path(__file__).parent / "_limited_impls.py").read_text()


def test_the_gate_narrows_to_what_the_kernel_takes_and_reports_the_pairs_it_judged(pytester):
    (pytester.path / "mynorms.py").write_text(LIMITED)  # (the isolated worker imports it from the run's directory)
    result = gate_here(pytester, "--normcheck-op", "layernorm", "--normcheck-impl",
                       "mynorms:once_differentiable_layer_norm", "--normcheck-scans", "without", "--normcheck-dtype",
                       "f32", "--normcheck-value-profile", "normal")
    lines, stdout = result.outlines, result.stdout.str()
    header = [line for line in lines if line.startswith("normcheck: narrowed: ")]
    assert result.ret == 0, stdout[-3000:]
    assert len(header) == 1 and header[0].startswith("normcheck: narrowed: order 1 only (not 2: only once differ")
    assert "SKIPPED" not in stdout and " skipped" not in lines[-1]
    judged = next(line for line in lines if line.endswith("pairs judged of the default sweep"))
    judged, designed = (int(n) for n in judged.split(": ")[-1].split(" pairs")[0].split(" of "))
    assert 0 < judged < designed
    never = [line for line in lines if line.startswith("normcheck: never judged: ")]
    assert [line.split(": ")[2] for line in never] == ["order=2", "order=fwd", "order=fwd-rev"]


def test_a_kernel_written_for_4d_input_is_hinted_to_the_rank_option_which_passes_it(pytester):
    (pytester.path / "mynorms.py").write_text(LIMITED)
    options = ["--normcheck-op", "batchnorm", "--normcheck-impl", "mynorms:batch_norm_4d_only", "--normcheck-scans", "without",
               "--normcheck-dtype", "f64", "--normcheck-memory-format", "contiguous", "--normcheck-value-profile", "normal"]
    result = gate_here(pytester, *options)
    assert result.ret == 1 and ("normcheck: hint: every rank 2, 3, 5 case raised ValueError: expected 4D input "
                                "(got 2D input); rank 4 runs without it: --normcheck-rank 4") in result.stdout.str()
    result = gate_here(pytester, *options, "--normcheck-rank", "4")
    assert result.ret == 0 and "normcheck: hint" not in result.stdout.str(), result.stdout.str()[-3000:]
