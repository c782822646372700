"""The default sweep: a pairwise covering design over the factors kernels dispatch on, every triple of the classes
they choose paths by, and boundary scans of every size.

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

from dataclasses import replace
from functools import lru_cache, wraps
from itertools import combinations

from covertable import make

from ..core.errors import UsageError
from ..numerics.formats import expressible, innermost_dim
from ..ops import Op, get_op
from ..ops.design import (CLASSES, REMAINDERS, SCAN_DTYPES, SCAN_ELEMENTS, SCAN_LAYOUT, SCAN_PROFILE, TRIPLE_STRENGTH,
                          Exclusion, Factor, remainder_of)
from .case import Case
from .covering import covering_array
from .narrowing import OPTION, Narrowing, fits, narrowed


def on_record(fn):
    """`fn` works on the op's record, fetched here once where a caller names the op (a test, the plugin's option)."""
    @wraps(fn)
    def on(op, *args, **kwargs):
        return fn(get_op(op) if isinstance(op, str) else op, *args, **kwargs)
    return on


@on_record
def factors(op: Op) -> tuple[Factor, ...]:
    """The op's factors: the shared ones, each replaced by the op's own of the same name, then its own (Op.design)."""
    return op.design.factors


@on_record
def exclusions(op: Op) -> tuple[Exclusion, ...]:
    return op.design.exclusions


@on_record
@lru_cache(maxsize=None)
def narrowed_design(op: Op, narrowing: Narrowing = Narrowing()) -> tuple[tuple[Factor, ...], tuple[Exclusion, ...]]:
    """The op's factors with the levels that survive the run's narrowing (cases.narrowing), and the exclusions
    still to respect."""
    if not narrowing:
        return factors(op), exclusions(op)
    fill = tuple(f.name for f in geometry_first(op, factors(op)))
    return narrowed(factors(op), exclusions(op), narrowing, lambda row: case_of(op, row, 0, narrowing), fill)


def geometry_first(op: Op, fs) -> list[Factor]:
    """`fs` in the order a row's free factors are filled: the op's own (its geometry: its usual sizes) first."""
    return sorted(fs, key=lambda f: f.name in op.design.shared)


@on_record
@lru_cache(maxsize=None)
def design(op: Op, narrowing: Narrowing = Narrowing()) -> tuple[dict, ...]:
    """The covering array: one {factor: value} per case."""
    rows = covering_array(*narrowed_design(op, narrowing))
    # after the covering array, never inside it: anchors reshape nothing the pairs chose
    return tuple(rows + [row for row in anchor_rows(op, narrowing) if row not in rows])


@on_record
@lru_cache(maxsize=None)
def anchor_rows(op: Op, narrowing: Narrowing = Narrowing()) -> tuple[dict, ...]:
    """The op's anchors (normcheck.ops.design.Anchor) as rows: every other factor at its usual level, or where
    that meets an exclusion, at its first level that does not. An anchor the run's narrowing leaves no level of
    (order 2 in f64 under --dtype f16) goes."""
    fs, excluded = narrowed_design(op, narrowing)
    kept = {f.name: f.values for f in fs}
    rows = []
    for anchor in op.design.anchors:
        if any(v not in kept[name] for name, v in anchor.values):
            continue
        row = filled(op, dict(anchor.values), fs, excluded)
        if row is None:
            raise ValueError(f"{op.name}: no level of some factor meets the anchor '{anchor.why}'")
        rows.append(row)
    return tuple(rows)


_NONE = object()  # (no level fits: None is a level of some factors, eps's)


def filled(op: Op, row: dict, fs, excluded, smaller: bool = False, prefer: dict | None = None) -> dict | None:
    """`row` with every other factor at its usual level, or where that meets an exclusion at its first level that
    does not (the op's geometry first; `smaller`: every size at the nearest level below its usual one instead;
    `prefer`: a row whose values come before those); None when a factor has no such level or the row's own values
    clash."""
    row = dict(row)
    given = list(row.items())
    if any(not fits(excluded, dict(given[:i]), name, v) for i, (name, v) in enumerate(given)):
        return None
    for f in geometry_first(op, fs):
        if f.name not in row:
            order = (f.values[f.usual],) + f.values
            if smaller and all(type(v) is int for v in f.values):
                usual = f.values[f.usual]
                order = tuple(sorted((v for v in f.values if v < usual), reverse=True)) or order
            order = ((prefer[f.name],) if prefer and f.name in prefer else ()) + order
            fitting = next((v for v in order if fits(excluded, row, f.name, v)), _NONE)
            if fitting is _NONE:
                return None
            row[f.name] = fitting
    return {f.name: row[f.name] for f in fs}


@on_record
@lru_cache(maxsize=None)
def triple_cases(op: Op, narrowing: Narrowing = Narrowing(), seed: int = 0) -> tuple[Case, ...]:
    """A case for every triple of the classes kernels choose paths by (ops.design.CLASSES: the dtype's, the layout's,
    the path's, the mode; and the remainder of the innermost extent, REMAINDERS), each class's levels taken in turn,
    the other factors at their usual levels (sizes just below them), the innermost extent set to the nearest size of
    its remainder that makes a valid case. A run that fixes the shape keeps it (no remainder); a triple no case takes
    (a channels-last layout with no 4-D rank) is left out."""
    fs, excluded = narrowed_design(op, narrowing)
    classes = level_classes(fs)
    sizes = {r.name: r.sizes for r in REMAINDERS} if "shape" not in narrowing.fixed else {"as fixed": ()}
    table = {**{name: list(grouped) for name, grouped in classes.items()}, "remainder": list(sizes)}
    strength = min(TRIPLE_STRENGTH, sum(len(v) > 1 for v in table.values()))
    if strength < 2:
        return ()
    turn = {}  # (factor, class) -> how many cases took one of its levels
    cases = []
    for combo in make(table, strength=strength):
        case = _triple_case(op, combo, classes, sizes[combo["remainder"]], turn, fs, excluded, narrowing, seed)
        if case is not None and case not in cases:
            cases.append(case)
    return tuple(cases)


def _triple_case(op, combo, classes, sizes, turn, fs, excluded, narrowing, seed) -> Case | None:
    """The case of one triple-design row: each factor's next level of its class (in turn) that a row takes."""
    def row_of(given):
        return filled(op, given, fs, excluded, smaller=True) or filled(op, given, fs, excluded)

    row = {}
    for name, grouped in classes.items():
        levels = grouped[combo[name]]
        start = turn.get((name, combo[name]), 0)
        for value in levels[start % len(levels):] + levels[:start % len(levels)]:
            if row_of({**row, name: value}) is not None:
                row[name] = value
                turn[name, combo[name]] = start + 1
                break
        else:
            return None
    case = case_or_none(op, row_of(row), narrowing, seed)
    if case is None:
        return None
    if not sizes:
        return narrowing.apply(case)
    dim = innermost_dim(case.x_format, len(case.shape))
    for n in sizes:
        shape = case.shape[:dim] + (n,) + case.shape[dim + 1:]
        try:
            resized = case.with_(shape=shape, split=_resplit(case, shape))
        except UsageError:
            continue
        applied = narrowing.apply(resized) if resized.numel <= SCAN_ELEMENTS else None
        if applied is not None:
            return applied
    return None


def level_classes(fs) -> dict[str, dict[str, list]]:
    """{selecting factor: {class: its levels in `fs`, in order}} (ops.design.CLASSES)."""
    classes = {}
    for f in fs:
        if f.name in CLASSES:
            for v in f.values:
                classes.setdefault(f.name, {}).setdefault(CLASSES[f.name](v), []).append(v)
    return classes


def class_of(case: Case, name: str) -> str:
    """The class a case has of a selecting factor (ops.design.CLASSES) or of its innermost extent ("remainder")."""
    if name == "remainder":
        return remainder_of(case.shape[innermost_dim(case.x_format, len(case.shape))])
    return CLASSES[name](next(f for f in factors(case.record) if f.name == name).read(case))


@on_record
def class_triples(op: Op, cases, narrowing: Narrowing = Narrowing()) -> tuple[int, int]:
    """(triples of classes some case holds, triples of the classes the narrowed design's levels fall in), read off
    `cases`."""
    table = {name: set(grouped) for name, grouped in level_classes(narrowed_design(op, narrowing)[0]).items()}
    if "shape" not in narrowing.fixed:
        table["remainder"] = {r.name for r in REMAINDERS}
    held = set()
    for case in cases:
        classes = {name: class_of(case, name) for name in table}
        held |= {tuple((n, classes[n]) for n in names) for names in combinations(table, 3)
                 if all(classes[n] in table[n] for n in names)}
    return len(held), sum(len(table[a]) * len(table[b]) * len(table[c]) for a, b, c in combinations(table, 3))


def _resplit(case: Case, shape: tuple[int, ...]):
    """The case's split over the same ranks, of the extent `shape` gives its split axis: each share scaled, the last
    rank taking what rounding leaves (a hidden-parallel op's innermost dim is the one it splits)."""
    if case.split is None:
        return None
    extent, old = case.record.layout.extent(shape), sum(case.split)
    if extent == old:
        return case.split
    shares = [share * extent // old for share in case.split[:-1]] if old else [0] * (len(case.split) - 1)
    return (*shares, extent - sum(shares))


@on_record
@lru_cache(maxsize=None)
def scan_rows(op: Op, narrowing: Narrowing = Narrowing()) -> tuple[tuple[str, int, dict], ...]:
    """The boundary scans (ops.design.Scan): (factor, size, row) for each size of each scanned factor, in f64 and
    f32 (a size only 5 and 7 times a power of two make: f32 alone; the run's dtypes where it narrows them away),
    contiguous, on normal data, every other factor at its usual level (the sizes just below where the usual ones make a
    case past SCAN_ELEMENTS). A size the run's fields decide otherwise (a --shape) is not a case of its scan."""
    fs, excluded = narrowed_design(op, narrowing)
    kept = {f.name: f for f in fs}

    def scanned_level(name, wanted):
        f = kept[name]
        return [v for v in wanted if v in f.values] or [f.values[f.usual]]

    dtypes = scanned_level("dtype", SCAN_DTYPES)
    common = {"layout": scanned_level("layout", [SCAN_LAYOUT])[0], "profile": scanned_level("profile", [SCAN_PROFILE])[0]}
    limit = SCAN_ELEMENTS * (narrowing.element_scale or 1)
    rows = []
    fixed = narrowing.fixed
    for f in factors(op):
        scanned = op.design.scans.get(f.name)
        if scanned is None or f.name not in kept or _fixed_by_run(f, fixed):
            continue  # (a run that fixes the size has no scan of it)
        scan = scanned.scan
        read, usual = scan.read or f.read, kept[f.name].values[kept[f.name].usual]
        for n in scanned.sizes:
            for dtype in (dtypes if n in scanned.in_every_dtype else dtypes[-1:]):
                given = {**(scan.values(n, usual) if scan.values else {f.name: n}), "dtype": dtype, **common}
                candidates = (filled(op, given, fs, excluded, smaller) for smaller in (False, True))
                row = next((row for row in candidates if _fits_scan(op, row, narrowing, read, n, limit)), None)
                if row is not None:
                    rows.append((f.name, n, row))
    return tuple(rows)


@on_record
def narrowed_away(op: Op, narrowing: Narrowing) -> list[tuple[str, tuple, dict]]:
    """(factor, levels kept, {level gone: why}) of each factor whose levels the narrowing's limits took away from the
    design the run asked for (Narrowing.unlimited); a level's why is the first limit's that declines it."""
    if narrowing.limits == narrowing.unlimited.limits:
        return []
    asked = {f.name: f.values for f in narrowed_design(op, narrowing.unlimited)[0]}
    own = [lim for lim in narrowing.limits if not lim.why.startswith(OPTION)]

    def cause(f: Factor, v) -> str:
        """The why of the limit that takes `v` away: one that declines it, else the one without which it stays (a
        level no case takes under another's: eval mode without running statistics, NDHWC without 5-D input)."""
        direct = next((lim.why for lim in own if not lim.allows_level(f, v)), None)
        if direct is not None:
            return direct
        for lim in own:
            try:
                kept = {g.name: g.values for g in narrowed_design(op, replace(
                    narrowing, limits=tuple(x for x in narrowing.limits if x != lim)))[0]}
            except UsageError:
                continue
            if v in kept[f.name]:
                return lim.why
        return "no case takes it under the implementation's limits"

    out = []
    for f in narrowed_design(op, narrowing)[0]:
        gone = {v: cause(f, v) for v in asked[f.name] if v not in f.values}
        if gone:
            out.append((f.name, f.values, gone))
    return out


def _fixed_by_run(f: Factor, fixed: dict) -> bool:
    """The run's fields decide the factor's value: a shape (every size), its field (groups), all its case fields (a
    split)."""
    if "shape" in fixed or (f.field is not None and f.field in fixed):
        return True
    return f.fields is not None and set(f.fields(f.values[0])) <= set(fixed)


def _fits_scan(op: Op, row: dict | None, narrowing: Narrowing, read, n: int, limit: float) -> bool:
    """A scan's row makes a case of size `n` (read back) of at most `limit` elements, in the run's world size."""
    case = case_or_none(op, row, narrowing)
    return case is not None and read(case) == n and case.numel <= limit and narrowing.apply(case) is not None


@on_record
def case_of(op: Op, row: dict, seed: int = 0, narrowing: Narrowing = Narrowing()) -> Case:
    """The case of a design's row, with the fields the run fixes set over it (they win), and those the
    implementation's limits give (limit_fields)."""
    fields = {name: value for name, (value, _) in limit_fields(op, narrowing).items()}
    for f in factors(op):
        if f.fields is not None and f.name in row:
            fields.update(f.fields(row[f.name]))
    fixed = narrowing.fixed
    geometry = op.sweep.shape({**fixed, **row})  # (a shape may follow a convention)
    return Case(op.name, seed=seed, **{**fields, **geometry, **fixed})


def case_or_none(op: Op, row: dict | None, narrowing: Narrowing = Narrowing(), seed: int = 0) -> Case | None:
    """The case of `row` (case_of), None where there is no row or it makes no case of the op."""
    if row is None:
        return None
    try:
        return case_of(op, row, seed, narrowing)
    except UsageError:
        return None


@on_record
def limit_fields(op: Op, narrowing: Narrowing) -> dict:
    """{field: (value, why)} of each limit that takes one value of a case field of the op's that no factor covers
    (a layer without running statistics: running_stats none) and the run does not fix: every case takes it."""
    covered = {f.name for f in factors(op)} | {name for f in factors(op) if f.fields is not None
                                                for name in f.fields(f.values[0])}
    return {lim.name: (lim.takes[0], lim.why) for lim in narrowing.limits
            if lim.takes is not None and len(lim.takes) == 1 and lim.name in op.case_fields
            and lim.name not in covered and lim.name not in narrowing.fixed}


def sweep_levels(narrowing: Narrowing = Narrowing()) -> Narrowing:
    """The narrowing whose levels a default sweep's rows take (its design's and its scans'): the run's (with the
    fields an implementation follows set); the part of the sweep a run takes (Narrowing.scans) changes no level."""
    return replace(narrowing, scans="with")


@on_record
def default_sweep(op: Op, seed: int = 0, follows=(), formats: tuple[str, ...] | None = None,
                  shares=None, narrowing: Narrowing = Narrowing()) -> list[Case]:
    """The op's sweep under the run's `narrowing` (cases.narrowing: the fields and world size it fixes); `follows`:
    (field, value) pairs an implementation fixes (Impl.follows), set on every case like the run's own;
    `formats`: the memory formats it can express (Impl.formats): a case in others takes the standard layout;
    `shares`: the one split of an extent over a number of ranks it expresses (Impl.shares): every case takes it.
    The covering design's cases come first, then the boundary scans (scan_rows), or either alone (Narrowing.scans).
    Cases that became the same case run once."""
    narrowing = narrowing.with_fields(follows) if follows else narrowing
    levels = sweep_levels(narrowing)
    designed = narrowing.scans != "only"
    cases = ([case_of(op, row, seed, narrowing) for row in design(op, levels)] if designed else []) \
        + (list(triple_cases(op, narrowing, seed)) if designed else []) \
        + ([case_of(op, row, seed, narrowing) for _, _, row in scan_rows(op, levels)] if narrowing.scans != "without"
           else [])
    if formats is not None:
        cases = [c if expressible(formats, c.x_format, c.dy_format)
                 else c.with_(x_format="contiguous", dy_format="contiguous") for c in cases]
    if shares is not None:
        cases = [c.with_(split=shares(c.record.layout.extent(c.shape), len(c.split))) for c in cases]
    return list(dict.fromkeys(cases))


@on_record
def coverage(op: Op, cases=None, narrowing: Narrowing = Narrowing()) -> tuple[dict, dict]:
    """({factor: {value: cases}}, {(factor, factor): {(value, value): cases}}), read off the cases (the sweep's
    under `narrowing` unless given), for every value that survives it and every pair that is not excluded (0: not
    covered)."""
    cases = default_sweep(op, narrowing=narrowing) if cases is None else cases
    fs, excluded = narrowed_design(op, narrowing)
    read = [{f.name: f.read(c) for f in fs} for c in cases]
    values = {f.name: {v: sum(r[f.name] == v for r in read) for v in f.values} for f in fs}
    pairs = {}
    for a, b in combinations(fs, 2):
        counts = {(va, vb): 0 for va in a.values for vb in b.values if fits(excluded, {a.name: va}, b.name, vb)}
        for r in read:
            if (r[a.name], r[b.name]) in counts:
                counts[r[a.name], r[b.name]] += 1
        pairs[a.name, b.name] = counts
    return values, pairs


@on_record
def admits(op: Op, case: Case, narrowing: Narrowing) -> bool:
    """Whether `case` (a generated one) has only levels the narrowing's limits take, each factor read off it."""
    return all(lim.allows_level(f, f.read(case)) for lim in narrowing.limits for f in factors(op))
