"""The covering array kept on disk (normcheck.cases.covering): what covertable builds, stored under a name that
everything it depends on makes, read back by the next process, and never read when it would be stale."""
from __future__ import annotations

import json

import pytest
from normcheck.cases import covering
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import narrowed_design
from normcheck.ops.design import Exclusion, Factor, levels


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path))
    return tmp_path / covering.FOLDER


def _factor(name, *values, usual=0):
    return Factor(name, levels(*[x for v in values for x in (v, "a level")]), read=lambda c: None, usual=usual)


FACTORS = (_factor("a", 1, 2, 3), _factor("b", "x", "y", usual=1), _factor("c", 0.5, None, (1, 2)))
NOT_3_WITH_Y = Exclusion(("a", "b"), lambda a, b: not (a == 3 and b == "y"), "a test exclusion")


def test_the_stored_array_is_covertables_and_the_next_call_reads_it(cache):
    # (a narrowed design: normcheck ships the default sweeps' only)
    fs, excluded = narrowed_design("groupnorm", Narrowing.of({"affine": "weight"}))
    built = covering.covering_array(fs, excluded)
    assert built == covering.built(fs, excluded)
    [stored] = cache.glob("*.json")
    # what is on disk is what a later call returns: rewrite it to one row and it reads that row
    first = json.loads(stored.read_text())[0]
    stored.write_text(json.dumps([first]))
    assert covering.covering_array(fs, excluded) == built[:1]


def test_another_level_usual_level_or_exclusion_is_another_array(cache):
    variants = [(FACTORS, ()), (FACTORS, (NOT_3_WITH_Y,)), (FACTORS[:2] + (_factor("c", 0.5, None),), ()),
                ((FACTORS[0], _factor("b", "x", "y", usual=0), FACTORS[2]), ())]
    for fs, excluded in variants:
        assert covering.covering_array(fs, excluded) == covering.built(fs, excluded)
    assert len(list(cache.glob("*.json"))) == len(variants)
    rows = covering.covering_array(FACTORS, (NOT_3_WITH_Y,))
    assert {(r["a"], r["b"]) for r in rows} == {(a, b) for a in (1, 2, 3) for b in "xy"} - {(3, "y")}


@pytest.mark.parametrize("text", ["not json", "[]", "[[0, 5, 0]]", '{"rows": 1}', "[[0, 1]]"])
def test_an_unreadable_or_foreign_file_is_rebuilt(cache, text):
    fresh = covering.covering_array(FACTORS, ())
    [stored] = cache.glob("*.json")
    stored.write_text(text)
    assert covering.covering_array(FACTORS, ()) == fresh


def test_an_unwritable_cache_still_builds(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("NORMCHECK_CACHE", str(blocker))  # (a file where the folder should be)
    assert covering.covering_array(FACTORS, ()) == covering.built(FACTORS, ())


def test_a_shipped_array_is_read_and_nothing_is_built(cache):
    fs, excluded = narrowed_design("groupnorm")
    rows = covering.covering_array(fs, excluded)
    assert not list(cache.glob("*.json"))  # (read from what normcheck ships; the cache untouched)
    assert covering._stored_form(fs, rows) == covering.shipped(covering.design_key(fs, excluded))
