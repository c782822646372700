"""The pairwise covering array of a sweep's factors, built by covertable and kept on disk between runs.

Building it is most of a second per op and narrowing (covertable evaluates the exclusions millions of times), and
every process that sweeps builds it again: the CLI on each run, each test process of the gate. The array is a
deterministic function of what covertable is given (its version, the factors' values in order, the usual level each
free slot takes, and which value pairs the exclusions allow, evaluated here on every pair of their factors' values),
so that, and nothing else, names the stored array (core.disk_cache): a changed level, why aside, or a changed
exclusion is another name, and a stale array is never read.

The arrays of the default sweeps (every op's, and under the conventions its records follow) ship with normcheck in
SHIPPED, under the same names, so that a fresh machine (a user's first run, CI's gate) builds none of them:
`python scripts/ship_designs.py` writes them again after a change to a design (which renames it), and
tests/meta/test_designs.py fails while one is missing or one no default sweep uses is left.
"""
from __future__ import annotations

import json
from importlib.metadata import version
from itertools import product
from pathlib import Path

from covertable import make

from ..core.disk_cache import digest, load_json, store_json
from ..ops.design import Exclusion, Factor

FOLDER = "designs"
SHIPPED = Path(__file__).with_name("designs")


def covering_array(fs: tuple[Factor, ...], excluded: tuple[Exclusion, ...]) -> list[dict]:
    """One {factor: value} per row, every factor in `fs`'s order: every value and every allowed pair of values of
    two factors in some row."""
    key = design_key(fs, excluded)
    for load in (shipped, lambda key: load_json(FOLDER, key)):
        stored = load(key)
        if _fits(stored, fs):
            return [{f.name: f.values[i] for f, i in zip(fs, row)} for row in stored]
    rows = built(fs, excluded)
    store_json(FOLDER, key, _stored_form(fs, rows))
    return rows


def design_key(fs: tuple[Factor, ...], excluded: tuple[Exclusion, ...]) -> str:
    """The name the covering array of `fs` and `excluded` is stored under (shipped or in the cache)."""
    return digest(_determinants(fs, excluded))


def shipped(key: str):
    """The array normcheck ships under `key`, or None."""
    try:
        return json.loads((SHIPPED / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def ship(fs: tuple[Factor, ...], excluded: tuple[Exclusion, ...]) -> str:
    """Build the covering array afresh and write it to SHIPPED; its key."""
    key = design_key(fs, excluded)
    SHIPPED.mkdir(exist_ok=True)
    rows = _stored_form(fs, built(fs, excluded))
    (SHIPPED / f"{key}.json").write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    return key


def built(fs: tuple[Factor, ...], excluded: tuple[Exclusion, ...]) -> list[dict]:
    """The covering array as covertable builds it (what covering_array stores), nothing read or written."""
    constraints = [{"operator": "fn", "requires": list(e.factors),
                    "evaluate": lambda row, e=e: e.allowed(row[e.factors[0]], row[e.factors[1]])}
                   for e in excluded]
    # (free slots take each factor's usual level)
    weights = {f.name: {f.usual: 2} for f in fs}
    rows = make({f.name: list(f.values) for f in fs}, constraints=constraints, weights=weights)
    return [{f.name: row[f.name] for f in fs} for row in rows]


def _determinants(fs, excluded) -> list:
    by_name = {f.name: f for f in fs}
    allowed = [[e.factors, [e.allowed(a, b) for a, b in product(by_name[e.factors[0]].values,
                                                                  by_name[e.factors[1]].values)]]
               for e in excluded]
    return [version("covertable"), [[f.name, [repr(v) for v in f.values], f.usual] for f in fs], allowed]


def _stored_form(fs, rows: list[dict]) -> list[list[int]]:
    """Rows as the indices of their values (what is stored: values need not be JSON)."""
    return [[_index(f, row[f.name]) for f in fs] for row in rows]


def _index(f: Factor, value) -> int:
    return next(i for i, v in enumerate(f.values) if v == value and repr(v) == repr(value))


def _fits(stored, fs) -> bool:
    """A stored array whose rows index every factor's values (anything else is recomputed)."""
    return (isinstance(stored, list) and bool(stored)
            and all(isinstance(row, list) and len(row) == len(fs)
                    and all(isinstance(i, int) and 0 <= i < len(f.values) for f, i in zip(fs, row))
                    for row in stored))
