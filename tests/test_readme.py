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
# what the rest of the claim says of the sweep's parts, up to the paragraph's end or the next op's command
PARTS = {"design": re.compile(r"(\d+) of the (?:covering )?design\b"),
         "triples": re.compile(r"(\d+) (?:of its )?class triples"),
         "scans": re.compile(r"(\d+) (?:of the )?boundary[- ]scans?\b"),
         "world sizes": re.compile(r"world sizes (\d+) to (\d+)")}


def sweep_parts(op: str) -> dict[str, tuple[int, ...]]:
    """What the default sweep of `op` has: its size and each part's (the sweep runs the design's cases, then the
    triples', then the scans', each case once: a part's count leaves out the cases an earlier part had), and the world
    sizes of its cases. Read off the sweep default_sweep built (its first cases are the design's; triple_cases is
    cached): no second sweep."""
    from normcheck.cases.narrowing import Narrowing
    from normcheck.cases.sweep import default_sweep, design, sweep_levels, triple_cases
    from normcheck.ops import get_op

    cases, record = default_sweep(op), get_op(op)
    designed = len(design(record, sweep_levels(Narrowing())))
    without = len(dict.fromkeys(cases[:designed] + list(triple_cases(record, Narrowing(), 0))))
    worlds = sorted({len(c.split) for c in cases if c.split}) or [0]
    return {"cases": (len(cases),), "design": (designed,), "triples": (without - designed,),
            "scans": (len(cases) - without,), "world sizes": (worlds[0], worlds[-1])}


def test_readmes_sweep_sizes_are_the_sweeps():
    """What README and the docs with samples say of a sweep's size and its parts in prose is what the default sweep
    has (their samples are checked above)."""
    claims = []
    for page in CHECKED:
        for claim in SWEEP_CLAIM.finditer(text := (ROOT / page).read_text()):
            op, rest = claim[1], text[claim.end():].split("\n\n")[0].split("`normcheck compare --op")[0]
            claims.append((page, op, "cases", (int(claim[3]),)))
            claims += [(page, op, part, tuple(map(int, m.groups()))) for part, pattern in PARTS.items()
                       if (m := pattern.search(rest))]
    assert {op for _, op, _, _ in claims} >= {"batchnorm", "layernorm", "rmsnorm", "instancenorm"}
    assert {part for _, _, part, _ in claims} == {"cases", *PARTS}
    parts = {op: sweep_parts(op) for op in {op for _, op, _, _ in claims}}
    assert [(page, op, part, n, parts[op][part]) for page, op, part, n in claims if n != parts[op][part]] == []


def test_readmes_gate_size_is_the_gates(gate_collected):
    """README sizes the gate with a bound its own collection keeps (conftest.py counts it in the session; an exact
    count would need editing with every test anyone adds)."""
    claim = re.search(r"the gate \(over ([\d,]+) tests", README.read_text())
    assert claim, "README's Development section sizes the gate as 'the gate (over N tests'"
    if gate_collected is None:
        pytest.skip("the gate's size is known only in a session that collected all of it (`pytest`, README's command)")
    assert gate_collected > int(claim[1].replace(",", "")), f"the gate collected {gate_collected} tests"


def test_readmes_install_lines_are_what_ci_installs():
    """The torch pin, the Python and torch floors, the extras and the gate's command README gives are the ones
    pyproject.toml and .ci/run (what CI runs on a fresh machine) use."""
    text, ci, project = README.read_text(), (ROOT / ".ci" / "run").read_text(), (ROOT / "pyproject.toml").read_text()
    pin = set(re.findall(r"torch==([\d.]+)", ci))
    assert len(pin) == 1 and set(re.findall(r"torch==([\d.]+)", text)) == pin, f"CI pins torch=={pin}"
    stale = [v for v in re.findall(r"\btorch (\d+\.\d+)\b", text) if not next(iter(pin)).startswith(f"{v}.")]
    assert not stale, f"README names torch {stale}, CI pins {pin}"
    python = re.search(r'requires-python = ">=([\d.]+)"', project)[1]
    torch_floor = re.search(r'"(torch>=[\d.]+)"', project)[1]
    assert f"Python ≥ {python}" in text and f"`{torch_floor}`" in text, (python, torch_floor)
    extras = set(re.findall(r"(?m)^(\w+) = \[", project.split("[project.optional-dependencies]")[1].split("\n[")[0]))
    named = {e for group in re.findall(r'\[([\w,]+)\]"', text) for e in group.split(",")}
    install = text.split("## Install")[1].split("\n## ")[0]
    assert named <= extras, f"README installs extras pyproject.toml lacks: {named - extras}"
    assert extras - {"dev"} <= set(re.findall(r"`(\w+)`", install)), "Install says what each extra brings"
    ci_extras = re.search(r'-e "\.\[([\w,]+)\]"', ci)[1]
    gate = ci.strip().splitlines()[-1]
    assert f'pip install -e ".[{ci_extras}]"\n{gate}\n' in text, f"CI installs [{ci_extras}] and runs `{gate}`"


def test_readmes_hypothesis_budgets_are_the_profiles():
    """The examples README gives each hypothesis profile are the profile's (normcheck/cases/budgets.py)."""
    from hypothesis import settings

    claims = re.findall(r"`(ci|dev|thorough)` \((?:default: )?(\d+) examples", README.read_text())
    assert {p for p, _ in claims} == {"ci", "dev", "thorough"}
    assert [(p, int(n)) for p, n in claims if settings.get_profile(p).max_examples != int(n)] == []


if __name__ == "__main__":  # print what each command of README and the docs prints now, page by page
    import tempfile

    for page, found in CHECKED.items():
        print(f"==> {page} <==")
        for command, _ in found:
            with tempfile.TemporaryDirectory() as tmp:
                print(f"$ {command}\n{run(command, Path(tmp))}")
