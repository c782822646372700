"""The pairwise covering array of a sweep's factors, built by covertable and kept on disk between runs.

Building it is most of a second per op and narrowing (covertable evaluates the exclusions millions of times), and
every process that sweeps builds it again: the CLI on each run, each test process of the gate. The array is a
deterministic function of what covertable is given (its version, the factors' values in order, the usual level each
free slot takes, and which value pairs the exclusions allow, evaluated here on every pair of their factors' values),
so that, and nothing else, names the stored array (core.disk_cache): a changed level, why aside, or a changed
exclusion is another name, and a stale array is never read.
"""
from __future__ import annotations

from importlib.metadata import version
from itertools import product

from covertable import make

from ..core.disk_cache import digest, load_json, store_json
from ..ops.design import Exclusion, Factor

FOLDER = "designs"


def covering_array(fs: tuple[Factor, ...], excluded: tuple[Exclusion, ...]) -> list[dict]:
    """One {factor: value} per row, every factor in `fs`'s order: every value and every allowed pair of values of
    two factors in some row."""
    key = digest(_determinants(fs, excluded))
    stored = load_json(FOLDER, key)
    if _fits(stored, fs):
        return [{f.name: f.values[i] for f, i in zip(fs, row)} for row in stored]
    rows = built(fs, excluded)
    store_json(FOLDER, key, [[_index(f, row[f.name]) for f in fs] for row in rows])
    return rows


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


def _index(f: Factor, value) -> int:
    return next(i for i, v in enumerate(f.values) if v == value and repr(v) == repr(value))


def _fits(stored, fs) -> bool:
    """A stored array whose rows index every factor's values (anything else is recomputed)."""
    return (isinstance(stored, list) and bool(stored)
            and all(isinstance(row, list) and len(row) == len(fs)
                    and all(isinstance(i, int) and 0 <= i < len(f.values) for f, i in zip(fs, row))
                    for row in stored))
