"""The default sweep: a pairwise covering design over the factors kernels dispatch on.

Each op's record declares its factors (normcheck.ops.design): the shared ones (dtype, layout, value
profile, rank, path through the layer; eval mode and order 2 where the op has them) and its own (rows,
hidden or set size, channels, groups, spatial size, batch, world split, eps, momentum, γ's scale), each
value on a dispatch boundary with a one-line why, and the pairs of values that cannot meet. covertable
builds the covering array: every value of every factor, and every pair of values of any two factors
that is not excluded, occurs in at least one case. The design is deterministic (covertable's hash
order, no seed): a normcheck version always makes the same cases; `seed` only changes their data.

`coverage(op)` counts, on the built cases, how many cover each value and each pair (every factor reads
its value back off the case); tests/meta/test_sweep.py fails when a declared value or pair is missing.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from covertable import make

from ..numerics.formats import expressible
from ..ops import get_op
from ..ops.design import Exclusion, Factor, shared_exclusions, shared_factors
from .case import DEFAULT_EPS, Case


@lru_cache(maxsize=None)
def factors(op: str) -> tuple[Factor, ...]:
    """The op's factors: the shared ones, each replaced by the op's own of the same name, then its own."""
    record = get_op(op)
    own = {f.name: f for f in record.sweep.factors}
    shared = [own.pop(f.name, f) for f in shared_factors(record)]
    return tuple(shared) + tuple(own.values())


@lru_cache(maxsize=None)
def exclusions(op: str) -> tuple[Exclusion, ...]:
    names = {f.name for f in factors(op)}
    return tuple(e for e in shared_exclusions(get_op(op)) + get_op(op).sweep.exclusions if set(e.factors) <= names)


def allowed(op: str, pair: dict) -> bool:
    """Whether values of two (or more) factors may meet in one case."""
    return all(e.allowed(pair[e.factors[0]], pair[e.factors[1]]) for e in exclusions(op) if set(e.factors) <= set(pair))


@lru_cache(maxsize=None)
def design(op: str) -> tuple[dict, ...]:
    """The covering array: one {factor: value} per case."""
    constraints = [{"operator": "fn", "requires": list(e.factors),
                    "evaluate": lambda row, e=e: e.allowed(row[e.factors[0]], row[e.factors[1]])}
                   for e in exclusions(op)]
    # (free slots take each factor's usual level)
    weights = {f.name: {f.usual: 2} for f in factors(op)}
    rows = make({f.name: list(f.values) for f in factors(op)}, constraints=constraints, weights=weights)
    order = [f.name for f in factors(op)]
    return tuple({name: row[name] for name in order} for row in rows)


def case_of(op: str, row: dict, seed: int = 0) -> Case:
    fields = {}
    for f in factors(op):
        if f.fields is not None:
            fields.update(f.fields(row[f.name]))
    return Case(op, seed=seed, **fields, **get_op(op).sweep.shape(row))


def default_sweep(op: str, seed: int = 0, follows=(), formats: tuple[str, ...] | None = None) -> list[Case]:
    """The op's sweep; `follows`: (field, value) pairs an implementation fixes (Impl.follows), set on every case;
    `formats`: the memory formats it can express (Impl.formats): a case in others takes the standard layout."""
    cases = [case_of(op, row, seed) for row in design(op)]
    if formats is not None:
        cases = [c if expressible(formats, c.x_format, c.dy_format)
                 else c.with_(x_format="contiguous", dy_format="contiguous") for c in cases]
    return [c.with_(**dict(follows)) for c in cases] if follows else cases


def coverage(op: str, cases=None) -> tuple[dict, dict]:
    """({factor: {value: cases}}, {(factor, factor): {(value, value): cases}}), read off the cases (the default
    sweep's unless given), for every declared value and every pair that is not excluded (0: not covered)."""
    cases = default_sweep(op) if cases is None else cases
    fs = factors(op)
    read = [{f.name: f.read(c) for f in fs} for c in cases]
    values = {f.name: {v: sum(r[f.name] == v for r in read) for v in f.values} for f in fs}
    pairs = {}
    for a, b in combinations(fs, 2):
        counts = {(va, vb): 0 for va in a.values for vb in b.values if allowed(op, {a.name: va, b.name: vb})}
        for r in read:
            if (r[a.name], r[b.name]) in counts:
                counts[r[a.name], r[b.name]] += 1
        pairs[a.name, b.name] = counts
    return values, pairs


def on_path(case: Case, path: dict) -> Case:
    """A sweep case on the path a run asks for (--mode, --frozen, --order); freezing x or the parameters needs
    parameters, so a case without them takes both; a mode that refuses eps = 0 takes the default eps."""
    if path.get("frozen", "none") != "none" and not case.affine:
        case = case.with_(affine=True)
    if case.eps == 0 and path.get("mode", case.mode) not in case.record.eps_zero:
        case = case.with_(eps=DEFAULT_EPS)
    return case.with_(**path) if path else case
