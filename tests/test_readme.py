"""README and the docs stay true: every `$ command` block in README.md and in docs/*.md is run, and every line it
shows (except the `...` that elide rows) must be a line the command prints. A change that alters a sample fails here
until the page is updated (`python tests/test_readme.py` prints the real output of each command, page by page)."""
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
# README, then every page of docs/ (those without a `$ command` block have nothing to check)
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```\n(\1\$ .*?)^\1```", re.S | re.M)  # also inside list items (indented)
# (pytest adds "(h:mm:ss)" to a time past a minute)
TIMES = [(re.compile(r"\bin \d+(\.\d+)? ?s\b( \(\d+:\d\d:\d\d\))?"), "in <time>"),
         (re.compile(r'"seconds": [0-9.]+'), '"seconds": <time>'),
         # pytest pads its summary line with = to a fixed width: a time with more digits takes one = less
         (re.compile(r"^=+ (.*?) =+$"), r"= \1 =")]


def samples_of(page: Path) -> list[tuple[str, list[str]]]:
    """(command, the lines the page shows for it) for every `$ command` in a code block of the page."""
    out = []
    for indent, block in BLOCK.findall(page.read_text()):
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
        raise AssertionError(f"a page runs {argv[0]!r}: teach tests/test_readme.py how")
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# {page: its samples} for every page that has some, README first
CHECKED = {name(page): found for page in PAGES if (found := samples_of(page))}
# (page, command, lines) for every sample of every page
SAMPLES = [(page, command, lines) for page, found in CHECKED.items() for command, lines in found]


def test_readme_has_samples_to_check():
    assert len(CHECKED.get("README.md", ())) >= 8 and len(SAMPLES) >= 23


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


@pytest.mark.parametrize("page, command, lines", SAMPLES, ids=[f"{page}: {c[:60]}" for page, c, _ in SAMPLES])
def test_readme_sample_is_what_the_command_prints(page, command, lines, tmp_path, monkeypatch, request):
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
    assert not stale, f"{page} shows lines `{command}` does not print:\n" + "\n".join(stale)


# "`normcheck compare --op OP` ... N cases" in one paragraph of prose
SWEEP_CLAIM = re.compile(r"`normcheck compare --op (\w+)`((?:(?!\n\n).)*?)\b(\d+)\s+cases", re.S)


def test_readmes_sweep_sizes_are_the_sweeps():
    """What README and the docs with samples say of a sweep's size in prose is what the default sweep has (their
    samples are checked above)."""
    from normcheck.cases.sweep import default_sweep

    claims = [(page, op, int(n)) for page in CHECKED for op, _, n in SWEEP_CLAIM.findall((ROOT / page).read_text())]
    assert {op for _, op, _ in claims} >= {"batchnorm", "layernorm", "rmsnorm", "instancenorm"}
    assert [(page, op, n) for page, op, n in claims if n != len(default_sweep(op))] == []


if __name__ == "__main__":  # print what each command of README and the docs prints now, page by page
    import tempfile

    for page, found in CHECKED.items():
        print(f"==> {page} <==")
        for command, _ in found:
            with tempfile.TemporaryDirectory() as tmp:
                print(f"$ {command}\n{run(command, Path(tmp))}")
