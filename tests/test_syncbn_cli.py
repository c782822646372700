"""`normcheck compare --op syncbn` end to end: the default sweep in gloo, user functions, hangs,
torchrun, and bad input."""
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from normcheck.cli import main
from normcheck.cases.tokens import decode_case
from normcheck.cases.sweep import default_sweep

ROOT = Path(__file__).resolve().parents[1]


def run(*argv):
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_default_sweep_runs_torchs_function_in_gloo_and_passes():
    start = time.monotonic()
    code, out = run("compare", "--op", "syncbn")
    lines = out.strip().splitlines()
    assert code == 0, out[-3000:]
    assert lines[-1].startswith(f"syncbn / torch: {len(default_sweep('syncbn'))} cases:") and " 0 failed" in lines[-1]
    assert any(",0," in line and line.startswith("PASS") for line in lines)  # an empty-rank split passes
    assert any("torch-syncbn-empty-rank-half" in line for line in lines)
    assert time.monotonic() - start < 120


def test_user_function_with_an_empty_rank():
    code, out = run("compare", "--one-case", "--op", "syncbn", "--impl", "tests._gloo_impls:sync_bn", "--split", "3,0,2",
                    "--dtype", "f64")
    assert code == 0, out
    assert out.splitlines()[0].startswith("PASS") and "split=3,0,2" in out


def test_a_hanging_function_fails_within_the_timeout_naming_the_rank():
    start = time.monotonic()
    code, out = run("compare", "--one-case", "--op", "syncbn", "--impl", "tests._gloo_impls:hangs_on_rank1", "--split", "2,2,2",
                    "--timeout", "3")
    assert code == 1
    assert "rank 1: timed out after 3 s" in out.splitlines()[0]
    assert time.monotonic() - start < 20


def test_recipes_in_lockstep_from_the_command_line():
    for recipe in ("torch19", "horovod", "master-worker"):
        code, out = run("compare", "--one-case", "--op", "syncbn", "--impl", recipe, "--backend", "lockstep", "--split", "5,0,3",
                        "--dtype", "mixed-bf16", "--memory-format", "channels_last")
        assert code == 0, out


def test_pre15_fails_on_an_uneven_split_from_the_command_line():
    code, out = run("compare", "--one-case", "--op", "syncbn", "--impl", "pre15", "--split", "1,7", "--cases", "2")
    replays = [line.split()[1:] for line in out.splitlines() if line.startswith("    replay:")]
    assert code == 1 and len(replays) == 2
    # Each replay names the world it ran in and a token holding the split and that row's seed.
    for seed, argv in enumerate(replays):
        assert argv[-2:] == ["--backend", "lockstep"]
        case = decode_case(argv[argv.index("--case") + 1])
        assert case.split == (1, 7) and case.seed == seed


def test_torchrun_env_backend():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "normcheck",
         "compare", "--one-case", "--op", "syncbn", "--backend", "env", "--impl", "torch19", "--split", "3,5", "--cases", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(rows) == 2 and all(r.startswith("PASS") for r in rows)  # only rank 0 reports


def test_torchrun_fixes_the_world_size_a_sweep_asks_for():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "normcheck",
         "compare", "--op", "syncbn", "--backend", "env", "--impl", "torch19", "--world-size", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    # (each rank says it, before any case ran; their lines may share a line of the launcher's stderr)
    said = proc.stderr.count("normcheck: error: --world-size 3: torchrun started 2 ranks")
    assert proc.returncode != 0 and said == 2 and "PASS" not in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--split", "3,0,5", "--world-size", "2"], "--split has 3 ranks but --world-size is 2"),
    (["--split", "3,-1,5"], "negative size"),
    (["--split", "3,0,5", "--shape", "9,3,4"], "sums to 8, not N=9"),
    (["--split", ",".join(["1"] * 65), "--backend", "lockstep"], "outside 1-64"),
    (["--split", ",".join(["1"] * 9)], "outside 1-8 for the gloo backend"),
    (["--impl", "tests.mutants.batchnorm:textbook"], "the contract is fn(input, weight, bias"),
    (["--impl", "master-worker", "--backend", "nope"], "invalid choice"),
    (["--world-size", "0"], "--world-size must be >= 1"),
])
def test_bad_syncbn_input_is_one_line_exit_2(argv, message, capsys):
    code = main(["compare", "--op", "syncbn", *argv], io.StringIO())
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_split_applies_to_distributed_ops_only(capsys):
    assert main(["compare", "--one-case", "--op", "batchnorm", "--split", "2,2"], io.StringIO()) == 2
    assert "syncbn, syncbn_silu, layernorm_sp" in capsys.readouterr().err
