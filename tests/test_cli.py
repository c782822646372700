"""The command line: rows and a summary, exit 0 / 1 / 2, one-line errors, never a traceback."""
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from normcheck import Case
from normcheck.cases.case import takers_of
from normcheck.cli import main
from normcheck.core.text import listing
from normcheck.cases.tokens import encode_case
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep

ROOT = Path(__file__).resolve().parents[1]
TOKEN = encode_case(Case("batchnorm", (4, 3, 5), "f16"))


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out)
    return code, out.getvalue()


def run_process(*argv, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "normcheck", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_default_sweep_that_passes_exits_0_with_a_row_per_case(capsys):
    # (every op's torch passes its sweep: tests/test_impls.py; here the command line around one, a short one, run by
    # the CLI's main in this process: a process of its own below)
    op = "syncbn_silu"
    code, out = run("compare", "--op", op)
    assert code == 0, out[-2000:] + capsys.readouterr().err
    lines = out.strip().splitlines()
    count = len(default_sweep(op))
    assert len(lines) == count + 1  # a row per case and the summary
    assert lines[-1].startswith(f"{op} / fused-silu: {count} cases:") and " 0 failed" in lines[-1]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("op, mutant", [("batchnorm", "tests.mutants.batchnorm:naive_variance")])
def test_a_mutant_given_as_impl_exits_1_with_replay_lines(op, mutant):
    code, out = run("compare", "--op", op, "--impl", mutant, "--scans", "without")  # (it fails on the design's cases)
    assert code == 1
    lines = out.splitlines()
    failing = [i for i, line in enumerate(lines) if line.startswith("FAIL")]
    assert failing and all(lines[i + 1].startswith("    replay: normcheck compare ") for i in failing)
    assert sum(line.startswith("    replay:") for line in lines) == len(failing)
    # The replay line re-runs exactly that case (its token names it), and it fails again, identically.
    for i in failing[:2]:
        argv = lines[i + 1].split()[3:]
        assert argv[:4] == ["--op", op, "--impl", mutant] and argv[4] == "--case"
        again, again_out = run("compare", *argv)
        assert again == 1 and again_out.splitlines()[0] == lines[i]


def test_explicit_case_options_and_cases_count():
    code, out = run("compare", "--one-case", "--op", "groupnorm", "--shape", "2,8,4,4", "--groups", "4", "--dtype", "mixed-bf16",
                    "--memory-format", "channels_last:contiguous", "--profile", "exact", "--cases", "3", "--seed", "9")
    rows = out.strip().splitlines()
    assert code == 0 and len(rows) == 4
    assert all("2x8x4x4 G=4 bf16/f32 channels_last:contiguous exact" in r for r in rows[:3])


def test_json_report():
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--shape", "4,3,5", "--json")
    data = json.loads(out)
    assert code == 0 and data["summary"]["pass"] == 1 and data["impl"] == "torch" and data["exit_status"] == 0
    tensors = {t["name"]: t for t in data["cases"][0]["tensors"]}
    assert set(tensors) >= {"y", "dx", "dweight", "dbias", "running_mean", "running_var"}
    assert all(t["max_ratio"] <= 1 and t["verdict"] == "PASS" for t in tensors.values())
    assert all(len(t["unit_ratios"]) == 3 and max(t["unit_ratios"]) == t["max_ratio"] for t in tensors.values())


def test_list_shows_ops_and_impls():
    code, out = run("list")
    assert code == 0 and "batchnorm:" in out and "groupnorm:" in out and "torch-native-backward" in out
    code, out = run("list", "--op", "groupnorm", "--json")
    data = json.loads(out)
    assert [d["op"] for d in data] == ["groupnorm"]
    names = {i["name"] for i in data[0]["impls"]}
    assert {"torch", "torch-native-backward", "baseline"} <= names
    # normcheck's channels-last kernel beside torch's, each at 1, 2 and 3 threads
    assert {f"cl-{s}-t{n}" for s in ("auto", "groups", "pixels") for n in (1, 2, 3)} <= names
    assert {f"torch-{k}-t{n}" for k in ("cl", "native-cl") for n in (1, 2, 3)} <= names


def test_list_says_which_conventions_each_record_follows():
    code, out = run("list", "--op", "rmsnorm")
    assert code == 0 and "follows normalized_at=trailing, weight_offset=0, casting=end" in out
    code, out = run("list", "--op", "layernorm", "--json")
    impls = {i["name"]: i for i in json.loads(out)[0]["impls"]}
    assert impls["torch"]["follows"] == {"normalized_at": "trailing", "fp8": None}  # (F.layer_norm returns y only)
    assert impls["torch-fp8-e4m3"]["follows"] == {"normalized_at": "trailing", "fp8": "e4m3"}


def test_user_impl_from_a_file(tmp_path):
    (tmp_path / "mybn.py").write_text(
        "import torch.nn.functional as F\n"
        "def bn(x, rm, rv, w, b, training, momentum, eps):\n"
        "    return F.batch_norm(x, rm, rv, w, b, training, momentum, eps)\n")
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--impl", f"{tmp_path / 'mybn.py'}:bn", "--shape", "3,2,4")
    assert code == 0 and out.splitlines()[0].startswith("PASS")


def test_a_user_file_may_define_dataclasses_and_shadows_no_module(tmp_path):
    """A file given by path runs as a module registered under a name of its own (a dataclass under postponed
    annotations looks its module up while the class is made), not as the stem's name: a file called json.py leaves
    the json module alone."""
    (tmp_path / "json.py").write_text(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n"
        "import torch.nn.functional as F\n"
        "@dataclass(frozen=True)\n"
        "class Blocks:\n"
        "    rows: int = 4\n"
        "def bn(x, rm, rv, w, b, training, momentum, eps):\n"
        "    assert Blocks().rows == 4\n"
        "    return F.batch_norm(x, rm, rv, w, b, training, momentum, eps)\n")
    code, out = run("compare", "--one-case", "--op", "batchnorm", "--impl", f"{tmp_path / 'json.py'}:bn", "--shape", "3,2,4")
    assert code == 0 and out.splitlines()[0].startswith("PASS")
    assert json.dumps({"a": 1}) == '{"a": 1}'


def test_user_impl_module_is_importable_from_the_current_directory(tmp_path):
    (tmp_path / "mygn.py").write_text("from torch.nn.functional import group_norm as gn\n")
    proc = run_process("compare", "--one-case", "--op", "groupnorm", "--impl", "mygn:gn", "--shape", "2,4,3", "--groups", "2",
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_eps_zero_is_legal_where_the_op_takes_it():
    assert main(["compare", "--one-case", "--op", "batchnorm", "--shape", "4,3", "--eps", "0", "--mode", "eval"]) == 0
    assert main(["compare", "--one-case", "--op", "layernorm", "--shape", "4,3", "--eps", "0"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["compare", "--one-case", "--op", "groupnorm", "--shape", "2,6,4", "--groups", "4"], "not divisible by groups"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "2,6,x"], "not a comma-separated list"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "2,6,4", "--groups", "2"], f"{listing(takers_of('groups'))} only"),
    (["compare", "--one-case", "--op", "batchnorm", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["compare", "--one-case", "--op", "batchnorm", "--memory-format", "nhwc"], "unknown memory format 'nhwc'"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "2,3,4", "--memory-format", "channels_last"], "needs a 4-D input"),
    (["compare", "--op", "batchnorm", "--impl", "no_such_module_xyz:fn"], "cannot import no_such_module_xyz"),
    (["compare", "--op", "batchnorm", "--impl", "json:nothing_here"], "has no attribute nothing_here"),
    (["compare", "--op", "batchnorm", "--impl", "math:pi"], "not callable"),
    (["compare", "--op", "batchnorm", "--impl", "math:sqrt"], "takes 1 positional arguments"),
    (["compare", "--op", "batchnorm", "--impl", "json:dumps"], "the contract is"),
    (["compare", "--op", "layernorm", "--framework", "numpy", "--impl", "json:dumps"],
     "the contract is fn(case, inputs) -> {output name: array}"),
    (["compare", "--op", "layernorm", "--impl", "tests._exits_on_import:layer_norm"],
     "cannot import tests._exits_on_import: its import called sys.exit(5)"),
    (["compare", "--op", "layernorm", "--impl", "tests._layer_classes:BUILT_LAYER_NORM"],
     "is a LayerNorm already built, whose sizes are fixed: give its class (torch.nn.modules.normalization:LayerNorm)"),
    (["compare", "--op", "batchnorm", "--impl", "nonsense"], "unknown implementation 'nonsense'"),
    (["compare", "--op", "rmsnorm2"], "invalid choice"),
    (["compare"], "required: --op"),
    (["compare", "--op", "batchnorm", "--cases", "0"], "must be >= 1"),
    (["compare", "--op", "batchnorm", "--case", "v1.bm90IGEgY2FzZQ.0"], "damaged (checksum mismatch)"),
    (["compare", "--op", "batchnorm", "--case", "v0.abc.def"], "version v0; this normcheck reads v1"),
    (["compare", "--op", "batchnorm", "--case", "normcheck"], "is not a normcheck replay token"),
    (["compare", "--op", "batchnorm", "--case", TOKEN, "--dtype", "f16"], "--case names the whole case; drop --dtype"),
    (["compare", "--op", "batchnorm", "--case", TOKEN, "--cases", "3"], "drop --cases"),
    (["compare", "--op", "groupnorm", "--case", TOKEN], "is a batchnorm case, not groupnorm"),
    (["compare", "--op", "batchnorm", "--junit-xml", "/no/such/dir/r.xml"], "directory /no/such/dir does not exist"),
    (["compare", "--op", "groupnorm", "--mode", "eval"], "--mode eval applies to the ops with running statistics"),
    (["compare", "--op", "rmsnorm", "--impl", "tests._declared_limits:f32_only_rms_norm", "--dtype", "f64", "--scans",
      "without"], "only a float32 kernel is built (the run fixes dtype=f64: without that option the sweep narrows to "
                  "what it takes)"),
    (["compare", "--op", "batchnorm", "--rank", "0"], "--rank 0: an input rank is a number of dims, at least 1"),
    (["compare", "--op", "batchnorm", "--one-case", "--rank", "4", "--shape", "4,3"], "--rank 4: --one-case's shape "
                                                                                         "4,3 has 2 dims"),
    (["compare", "--op", "batchnorm", "--case", TOKEN, "--rank", "4"], "--case names the whole case; drop --rank"),
    (["compare", "--op", "batchnorm", "--order", "3"], "order must be one of 1, 2, fwd, fwd-rev, got '3'"),
    (["compare", "--op", "batchnorm", "--frozen", "params", "--affine", "none"], "no parameters to freeze"),
    (["compare", "--op", "batchnorm", "--case", TOKEN, "--order", "2"], "--case names the whole case; drop --order"),
    # values that used to get through: a traceback, a FAIL row blaming torch, or argparse's puzzle
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "100000,1000,1000", "--dtype", "f16"],
     "shape 100000x1000x1000 has 100,000,000,000 elements: judging it needs about"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "4,3", "--momentum", "nan"], "momentum must be a number from 0 to 1, got nan"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "4,3", "--momentum", "2"], "momentum must be a number from 0 to 1, got 2.0"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "4,3", "--eps", "0"], "batchnorm takes eps > 0 in train mode"),
    (["compare", "--one-case", "--op", "batchnorm", "--shape", "-4,3,5"], "shape -4x3x5 has a negative size"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    code = main(argv, io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("normcheck: error:") and message in err
    assert "Traceback" not in err


def test_usage_error_from_a_real_process_has_no_traceback():
    proc = run_process("compare", "--one-case", "--op", "groupnorm", "--shape", "2,6,4", "--groups", "4")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "normcheck: error: C=6 is not divisible by groups=4\n"


@pytest.mark.parametrize("argv, message", [
    (["compare", "--op", "nosuch"], "argument --op: invalid choice: 'nosuch'"),
    (["compare", "--op", "layernorm", "--dtype", "f99"], "argument --dtype: unknown dtype 'f99'"),
])
def test_the_command_checks_its_arguments_before_it_imports_torch(argv, message):
    # The command's own entry (normcheck.__main__.run) in a fresh interpreter: one line, exit 2, at once (importing
    # torch took 6-15 s before the parser ran), and nothing loaded torch (nor started a fork server that does)
    code = ("import sys\nfrom normcheck.__main__ import run\nstatus = run(sys.argv[1:])\n"
            "print('torch' in sys.modules)\nsys.exit(status)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    elapsed = time.perf_counter() - start
    assert (proc.returncode, proc.stdout) == (2, "False\n"), proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("normcheck: error:") and message in proc.stderr
    assert elapsed < 2, f"{elapsed:.1f} s for a usage error"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a file every write to fails")
def test_a_report_that_cannot_be_written_is_one_line_and_exit_74(capsys):
    # (`normcheck list > /dev/full` printed a traceback, exit 1)
    with io.TextIOWrapper(io.FileIO("/dev/full", "w"), write_through=True) as full:
        code = main(["list", "--op", "layernorm"], full)
    err = capsys.readouterr().err
    assert code == 74 and err == "normcheck: error: the report could not be written: No space left on device\n"


def test_a_token_runs_exactly_its_case():
    code, out = run("compare", "--op", "batchnorm", "--case", TOKEN)
    assert code == 0 and out.splitlines()[0].split()[2:6] == ["4x3x5", "f16", "contiguous", "normal"]
    assert out.splitlines()[1].startswith("batchnorm / torch: 1 cases:")


def test_path_options_put_the_whole_sweep_or_an_explicit_case_on_that_path():
    code, out = run("compare", "--op", "syncbn_silu", "--mode", "eval", "--frozen", "x")
    rows = out.strip().splitlines()[:-1]
    assert code == 0 and len(rows) == len(default_sweep("syncbn_silu", narrowing=Narrowing.of({"mode": "eval", "frozen": "x"})))
    assert all(r.split()[0] in ("PASS", "MISTRUSTED") and " eval frozen-x" in r for r in rows)
    code, out = run("compare", "--one-case", "--op", "layernorm", "--shape", "4,8", "--normalized-dims", "1", "--frozen", "params",
                    "--order", "2", "--json")
    case = json.loads(out)["cases"][0]
    assert code == 0 and (case["case"]["frozen"], case["case"]["order"]) == ("params", 2)
    assert [t["name"] for t in case["tensors"]] == ["y", "dx", "d2x", "d2dy"]  # no dγ, dβ: the parameters are frozen


def test_what_an_implementation_prints_never_breaks_the_json_document():
    done = subprocess.run([sys.executable, "-m", "normcheck", "compare", "--one-case", "--op", "batchnorm", "--impl",
                           "tests._wrapping_impls:prints_while_it_runs", "--shape", "4,3", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["pass"] == 1 and "debug: in my batch_norm" not in done.stdout


def test_version_and_a_name_registered_for_another_op(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("normcheck ")
    assert main(["compare", "--one-case", "--op", "batchnorm", "--impl", "torch19", "--shape", "4,3"]) == 2
    assert "(torch19 is an implementation of syncbn)" in capsys.readouterr().err


def test_the_python_api_takes_a_layernorm_case_over_its_last_dim_as_the_cli_does():
    from normcheck import Case

    assert Case("layernorm", (4, 6)).normalized_dims == 1 == Case("rmsnorm", (4, 6)).normalized_dims
    assert Case("layernorm", (4, 6, 5), normalized_dims=2).view.set_size == 30


@pytest.mark.parametrize("op", ["batchnorm", "syncbn"])
def test_list_coverage_prints_every_value_and_pair_with_its_cases(op, capsys):
    from normcheck.cases.sweep import default_sweep, factors

    assert main(["list", "--op", op, "--coverage"]) == 0
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    design = default_sweep(op, narrowing=Narrowing(scans="without"))
    scans = len(default_sweep(op)) - len(design)
    assert first.startswith(f"{op}: {len(design)} cases")
    assert first.endswith(f"every allowed pair covered; {scans} boundary-scan cases besides")
    assert all(f"  {f.name}\n" in text for f in factors(op)) and "excluded pairs:" in text
    assert "    contiguous_size1 " in text  # size-1 dims at non-canonical strides (issue 41)
    assert main(["list", "--op", op, "--coverage", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["missing"] == [] and doc["cases"] == len(design) and sum(s["cases"] for s in doc["scans"]) == scans
    assert all(v["cases"] > 0 and v["why"] for f in doc["factors"] for v in f["values"])
    layouts = {v["value"] for f in doc["factors"] if f["name"] == "layout" for v in f["values"]}
    assert "contiguous_size1" in layouts and ("channels_last_size1:contiguous" in layouts) == (op == "batchnorm")
    assert main(["list", "--coverage"]) == 2
    assert "--coverage needs --op OP" in capsys.readouterr().err


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "add_rmsnorm"])
def test_an_empty_batch_is_one_line_not_a_traceback(op, capsys):
    for explicit in ([], ["--one-case"]):  # (the sweep narrowed to that shape, and the one case)
        assert main(["compare", *explicit, "--op", op, "--shape", "0,16"]) == 2
        assert capsys.readouterr().err == ("normcheck: error: shape 0x16 has no elements: an empty batch is not judged "
                                           "(a distributed op's empty rank is a 0 in --split)\n")


def test_a_numpy_function_returns_every_output_itself():
    """--framework numpy: fn(case, inputs) -> {output: array}, as README says (normcheck's same-precision baseline is
    one such function, and passes)."""
    code, out = run("compare", "--one-case", "--op", "layernorm", "--framework", "numpy", "--impl",
                    "normcheck.engine.baseline:baseline_outputs", "--shape", "4,8", "--cases", "2")
    assert code == 0 and out.splitlines()[-1].startswith(
        "layernorm / normcheck.engine.baseline:baseline_outputs: 2 cases: 2 passed"), out
