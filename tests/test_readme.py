"""README stays true: every `$ command` block in README.md is run, and every line it shows (except the
`...` that elide rows) must be a line the command prints. A change that alters a sample fails here
until README is updated (`python tests/test_readme.py` prints the real output of each command)."""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^( *)```\n(\1\$ .*?)^\1```", re.S | re.M)  # also inside list items (indented)
# (pytest adds "(h:mm:ss)" to a time past a minute)
TIMES = [(re.compile(r"\bin \d+(\.\d+)? ?s\b( \(\d+:\d\d:\d\d\))?"), "in <time>"),
         (re.compile(r'"seconds": [0-9.]+'), '"seconds": <time>'),
         # pytest pads its summary line with = to a fixed width: a time with more digits takes one = less
         (re.compile(r"^=+ (.*?) =+$"), r"= \1 =")]


def samples() -> list[tuple[str, list[str]]]:
    """(command, the lines README shows for it) for every `$ command` in a README code block."""
    out = []
    for indent, block in BLOCK.findall(README.read_text()):
        block = "\n".join(line[len(indent):] for line in block.split("\n"))
        for chunk in re.split(r"(?m)^(?=\$ )", block):
            if chunk.strip():
                command, *lines = chunk.rstrip("\n").split("\n")
                out.append((command[2:], lines))
    return out


def normalise(line: str) -> str:
    for pattern, text in TIMES:
        line = pattern.sub(text, line)
    return line.rstrip()


def run(command: str, workdir: Path) -> str:
    argv = shlex.split(command)
    env = dict(os.environ, CI="1", NO_COLOR="1", PYTHONPATH=str(ROOT))
    if argv[0] == "normcheck":
        argv, cwd = [sys.executable, "-m", "normcheck", *argv[1:]], ROOT
    elif argv[0] == "pytest":  # the plugin in a user's project: the SyncBN mutant as mypkg/sync.py:sync_bn
        (workdir / "mypkg").mkdir(exist_ok=True)
        (workdir / "mypkg" / "__init__.py").write_text("")
        (workdir / "mypkg" / "sync.py").write_text((ROOT / "tests" / "mutants" / "syncbn.py").read_text()
                                                  + "\nsync_bn = mean_dy_over_world_size\n")
        argv, cwd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv[1:]], workdir
    else:
        raise AssertionError(f"README runs {argv[0]!r}: teach tests/test_readme.py how")
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


SAMPLES = samples()


def test_readme_has_samples_to_check():
    assert len(SAMPLES) >= 8


def run_here(command: str, monkeypatch) -> str:
    """What a `normcheck` command prints, run by the CLI's main in this process (as `python -m normcheck` runs it,
    without a new interpreter and torch import per sample); a `pytest` run in a process of its own (`run`), but for
    a usage error (`pytest_here`)."""
    from normcheck.cli import main

    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(shlex.split(command)[1:], out)
        except SystemExit:  # argparse's own errors
            pass
    return out.getvalue() + err.getvalue()


def pytest_here(command: str, pytester) -> str:
    """What a `pytest` command prints, run by pytest's main in this process (pytester), for a sample that stops at
    its options with one line: that line needs no interpreter and torch import of its own."""
    import torch  # noqa: F401 - before the run: pytester forgets the modules a run imported, and torch loads once
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *shlex.split(command)[1:])
    return "\n".join(result.outlines + result.errlines)


@pytest.mark.parametrize("command, lines", SAMPLES, ids=[c[:60] for c, _ in SAMPLES])
def test_readme_sample_is_what_the_command_prints(command, lines, tmp_path, monkeypatch, request):
    if command.startswith("normcheck "):
        printed = run_here(command, monkeypatch)
    elif command.startswith("pytest ") and len(lines) == 1 and lines[0].startswith("ERROR: "):  # a usage error
        monkeypatch.setenv("CI", "1")
        monkeypatch.setenv("NO_COLOR", "1")
        printed = pytest_here(command, request.getfixturevalue("pytester"))
    else:
        printed = run(command, tmp_path)
    printed = {normalise(line) for line in printed.splitlines()}
    stale = [line for line in lines if not line.lstrip().startswith("...") and normalise(line) not in printed]
    assert not stale, f"README shows lines `{command}` does not print:\n" + "\n".join(stale)


# "`normcheck compare --op OP` ... N cases" in one paragraph of prose
SWEEP_CLAIM = re.compile(r"`normcheck compare --op (\w+)`((?:(?!\n\n).)*?)\b(\d+)\s+cases", re.S)


def test_readmes_sweep_sizes_are_the_sweeps():
    """What README says of a sweep's size in prose is what the default sweep has (its samples are checked above)."""
    from normcheck.cases.sweep import default_sweep

    claims = [(op, int(n)) for op, _, n in SWEEP_CLAIM.findall(README.read_text())]
    assert {op for op, _ in claims} >= {"batchnorm", "layernorm", "rmsnorm", "instancenorm"}
    assert [(op, n) for op, n in claims if n != len(default_sweep(op))] == []


if __name__ == "__main__":  # print what each README command prints now
    import tempfile

    for command, _ in SAMPLES:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"$ {command}\n{run(command, Path(tmp))}")
