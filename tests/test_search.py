"""The budgeted search (`normcheck compare --budget`, `--normcheck-budget`): sizes rich in tile widths, and a search
that finds, shrinks and replays a bug the default sweep cannot reach (tests/_search_mutants.py: LayerNorm rows of 11
or 13 tiles)."""
from __future__ import annotations

import io
import json
import shlex
from collections import Counter
from math import prod

import pytest
from hypothesis import Phase, given, settings

from normcheck.cases.search_space import tile_sizes
from normcheck.cases.sweep import default_sweep
from normcheck.cases.tokens import decode_case
from normcheck.cli import main
from normcheck.engine.search import budget_seconds
from tests._search_mutants import tile_of
from tests.test_reports import check_against_doc, documented_tables

MUTANT = "tests._search_mutants:tile_table_layer_norm"
NARROWED = ("--dtype", "f32", "--memory-format", "contiguous")  # (cheaper cases; the path shows in every dtype)
# Draws that meet the mutant's path within their first cases; any seed does within a few hundred (half a minute)
SEED = "8"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path))  # (the search's example database: never the repository's)


def run(*argv) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def odd_part(n: int) -> int:
    return n >> ((n & -n).bit_length() - 1)


def test_sizes_are_rich_in_tile_widths_of_many_odd_multiples():
    drawn = []

    @settings(max_examples=3000, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(tile_sizes(1, 1 << 16))
    def draw(n):
        drawn.append(n)

    draw()
    assert 1 <= min(drawn) and max(drawn) <= 1 << 16
    seen = set(drawn)
    for k in (1, 3, 5, 7, 11, 13, 29):  # k·2^j − 1, k·2^j and k·2^j + 1, each for some j >= 2
        assert {d for d in (-1, 0, 1) for j in range(2, 13) if k * 2 ** j + d in seen} == {-1, 0, 1}, k
    exact = Counter(odd_part(n) for n in drawn if n >= 4)  # (k·2^j itself: its odd part is k)
    assert exact[1] > exact[3] > exact[31] > 0  # the small multiples likelier, every one drawn
    assert any(odd_part(n) > 31 and odd_part(n - 1) > 31 and odd_part(n + 1) > 31 for n in drawn)  # plain sizes too


def test_the_default_sweep_never_takes_the_mutants_path():
    assert (tile_of(2816), tile_of(88), tile_of(104), tile_of(44), tile_of(2817)) == (256, 8, 8, None, None)
    rows = {c.view.set_size for c in default_sweep("layernorm")}
    assert len(rows) > 50 and [h for h in rows if tile_of(h) is not None] == []


def test_a_budgeted_search_finds_the_mutant_shrinks_it_and_its_replay_line_reproduces_it():
    code, out = run("compare", "--op", "layernorm", "--impl", MUTANT, "--budget", "40s", "--seed", SEED, *NARROWED,
                    "--json")
    doc = json.loads(out)
    tables = documented_tables()
    check_against_doc(doc, tables[""], "report")
    check_against_doc(doc["search"], tables["search"], "search")
    search, [found] = doc["search"], doc["cases"]
    assert code == doc["exit_status"] == 1 and found["verdict"] == "FAIL" and search["seed"] == int(SEED)
    assert search["first_failure_s"] < 40 and search["shrunk"] and search["shrink_cases"] > 0
    case = decode_case(found["token"])
    hidden = prod(case.shape[-case.normalized_dims:])
    assert search["elements"] == case.numel <= 4096 and tile_of(hidden) is not None and case.has_bias
    assert any(site.startswith("y: ") and f"columns {hidden - tile_of(hidden)}..{hidden - 1} of {hidden}" in site
               for site in search["sites"]), search["sites"]  # (the last tile's columns)

    argv = shlex.split(found["replay"])
    assert argv[:2] == ["normcheck", "compare"]
    code, out = run(*argv[1:])
    assert code == 1 and out.startswith("FAIL ") and f" {case.label} " in out.splitlines()[0]


def test_a_correct_implementation_passes_a_short_search():
    code, out = run("compare", "--op", "layernorm", "--budget", "3", *NARROWED)
    summary = out.splitlines()[-1]
    assert code == 0 and summary.startswith("layernorm / torch: searched ")
    assert int(summary.split("searched ")[1].split()[0]) > 0 and " 0 failed" in summary and "FAIL" not in out


@pytest.mark.parametrize("text, seconds", [("300", 300), ("300s", 300), ("5m", 300), ("1h", 3600), ("1.5m", 90)])
def test_a_budget_is_seconds_minutes_or_hours(text, seconds):
    assert budget_seconds(text) == seconds


@pytest.mark.parametrize("argv", [["--budget", "5x"], ["--budget", "0"], ["--budget", "m"], ["--budget=-3"],
                                  ["--budget", "5m", "--one-case"]])
def test_a_bad_budget_is_a_one_line_usage_error(capsys, argv):
    code, out = run("compare", "--op", "layernorm", *argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and out == "" and len(errors) == 1 and "--budget" in errors[0], errors


def test_the_plugin_runs_the_search_as_one_test(pytester):
    # (a shape on the mutant's path: every case the search draws meets it, and it shrinks over the other factors)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", "--normcheck-op", "layernorm",
                                          "--normcheck-impl", MUTANT, "--normcheck-budget", "20",
                                          "--normcheck-shape", "3,88", "--normcheck-dtype", "f32")
    text = "\n".join(result.outlines)
    assert result.ret == 1 and "1 failed" in text and "test_default_sweep" not in text, text[-2000:]
    assert f"replay: normcheck compare --op layernorm --impl {MUTANT} --case v3." in text
    assert "y: " in text and "columns 80..87 of 88" in text and "layernorm / " in text and "--seed " in text
