"""What a run fixes, and the factor levels of a sweep that survive it.

Every case option has one meaning: it fixes that factor, and the covering design covers the rest. A `Narrowing`
holds the case fields a run fixes (dtype, layout, value profile, an op's geometry fields such as groups or the
normalised dims, the residual stream's dtype, a shape, eps, the path through the layer, a world's split, the
conventions an implementation follows) and a world size.

Which levels survive is read off built cases, never decided by name: a level survives when a case built with it
(the other factors at surviving levels, the run's fields set over them) is a valid case that reads every factor's
level back. `--dtype f32` keeps the (f32, f32) level; `--frozen x` keeps the paths that freeze x; `--normalized-dims 1`
keeps one normalised dim and the ranks that leave rows; `--memory-format channels_last` keeps 4-D inputs; a value
no level has (`--eps 3e-4`, the rows of a `--shape`) becomes the factor's one level. A run no case can take is the
trial case's one-line UsageError, which names the clash.

What an implementation cannot do narrows the same way (`Limit`: the values of a factor or case field it takes, or
those it declines, and why: a backward that is only once differentiable, a layer with no bias, a layer written for
4-D input): its levels go from the design, so the covering array covers every pair again inside what it takes. The
run's own fields win over a limit (an --order 2 run of a once-differentiable kernel is judged as far as it goes).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..core.errors import UsageError
from ..numerics.dtypes import parse_dtype
from ..ops.design import Exclusion, Factor, Level

# Which part of the sweep a run takes: the covering design's cases and then the boundary scans (with), the design's
# alone (without: a quicker run), or the scans alone (only: chasing a size path)
SCANS = ("with", "without", "only")
GIVEN = "fixed by the run"  # the why of a level the run gave that the design does not declare
OPTION = "--"               # a Limit whose why starts so is the run's own option (--rank 4), not the implementation's
SPLIT = "split"             # the factor a world size narrows (ops.design.split_factor)


@dataclass(frozen=True)
class Limit:
    """What an implementation (or a run's option that keeps several levels, --rank) takes of one factor or case field
    (`name`: order, rank, affine, ...): only the values `takes` (None: any) and never those `declines`; `why`: one line
    saying so."""
    name: str
    takes: tuple | None = None
    declines: tuple = ()
    why: str = ""

    def allows(self, value) -> bool:
        return (self.takes is None or value in self.takes) and value not in self.declines

    def allows_level(self, f: Factor, value) -> bool:
        """Whether the factor's level `value` is one it takes (a level of a factor it does not name: yes)."""
        if f.name == self.name:
            return self.allows(value)
        if f.fields is not None:
            fields = f.fields(value)
            return self.name not in fields or self.allows(fields[self.name])
        return True


@dataclass(frozen=True)
class Narrowing:
    """`fields`: (Case field, value) pairs every case of the sweep takes; `world_size`: the number of ranks every
    case of a distributed op has; `element_scale`: how much smaller than the design's own bounds a case's elements
    must stay where it runs (Triton's interpreter: every level and pair kept, with smaller companions); `scans`: which
    part of the sweep runs (SCANS); `limits`: what the implementation takes (Limit), a field the run fixes winning."""
    fields: tuple[tuple[str, Any], ...] = ()
    world_size: int | None = None
    element_scale: float | None = None
    scans: str = "with"
    limits: tuple[Limit, ...] = ()

    @classmethod
    def of(cls, fields: dict | None = None, world_size: int | None = None,
           element_scale: float | None = None, scans: str = "with", limits=()) -> "Narrowing":
        if scans not in SCANS:
            raise UsageError(f"scans must be one of {', '.join(SCANS)}, got {scans!r}")
        return cls(tuple(sorted((fields or {}).items())), world_size, element_scale, scans, tuple(limits))

    def with_limits(self, limits) -> "Narrowing":
        """This narrowing with more limits (each once)."""
        return replace(self, limits=tuple(dict.fromkeys(self.limits + tuple(limits))))

    @property
    def unlimited(self) -> "Narrowing":
        """The run's own narrowing, without what the implementation's limits took away: the design it asked for."""
        return replace(self, limits=tuple(lim for lim in self.limits if lim.why.startswith(OPTION)))

    @property
    def fixed(self) -> dict:
        return dict(self.fields)

    def with_fields(self, pairs) -> "Narrowing":
        """This narrowing with more fields fixed (an implementation's conventions); a field it fixes already wins."""
        return replace(self, fields=Narrowing.of({**dict(pairs), **self.fixed}).fields)

    def __bool__(self) -> bool:  # (whether it narrows the factors' levels: `scans` picks cases, not levels)
        return bool(self.fields) or self.world_size is not None or self.element_scale is not None or bool(self.limits)

    def apply(self, case):
        """`case` with the run's fields, or None when it cannot take them (a generated case): its world size too."""
        if self.world_size is not None and case.split is not None and len(case.split) != self.world_size:
            return None
        try:
            return case.with_(**self.fixed) if self.fields else case
        except UsageError:
            return None


def option_fields(dtype: str | None = None, memory_format: str | None = None, profile: str | None = None,
                  shape: tuple[int, ...] | None = None, split: tuple[int, ...] | None = None) -> dict:
    """The Case fields the case options give, each only where given (the CLI's and the pytest plugin's): a dtype
    name (mixed-bf16: bf16 input, f32 parameters), a layout X[:DY] (dy in x's unless given), a value profile, a
    shape, a split."""
    fields = {}
    if dtype is not None:
        spec = parse_dtype(dtype)
        fields.update(dtype=spec.dtype, param_dtype=spec.param_dtype)
    if memory_format is not None:
        x_format, _, dy_format = memory_format.partition(":")
        fields.update(x_format=x_format, dy_format=dy_format or x_format)
    fields.update({name: v for name, v in (("profile", profile), ("shape", shape), ("split", split)) if v is not None})
    return fields


def rank_limit(ranks: tuple[int, ...] | None, option: str = "--rank") -> tuple[Limit, ...]:
    """The run's input ranks (a layer written for 4-D input) as a Limit of the rank factor, named by its option."""
    if ranks is None:
        return ()
    if any(r < 1 for r in ranks):
        raise UsageError(f"{option} {','.join(map(str, ranks))}: an input rank is a number of dims, at least 1")
    return (Limit("rank", takes=tuple(ranks), why=f"{option} {','.join(map(str, ranks))}"),)


Build = Callable[[dict], Any]  # a row {factor: value} -> a Case with the run's fields (UsageError: none)


def narrowed(factors: tuple[Factor, ...], exclusions: tuple[Exclusion, ...], narrowing: Narrowing, build: Build,
             fill_order: tuple[str, ...]) -> tuple[tuple[Factor, ...], tuple[Exclusion, ...]]:
    """The factors with the levels that survive `narrowing`, and the exclusions still to respect (those between two
    factors the run fixed go: the run asked for that combination). `build(row)`: the case a full row makes under the
    run's fields; `fill_order`: the order a trial row's other factors are filled in (the op's geometry first).

    Four steps: the levels the run's fields give; those the implementation's limits leave of the rest; the exclusions
    still to respect; then the levels whose trial cases are valid and read them back (survivors)."""
    levels, given = given_levels(factors, narrowing)
    levels = limited_levels(factors, levels, given, narrowing)
    exclusions = kept_exclusions(factors, exclusions, given, narrowing)
    by_name = {f.name: f for f in factors}
    trials = Trials(tuple(by_name[name] for name in fill_order), exclusions, build)
    levels = survivors(factors, levels, trials)
    return tuple(replace(f, levels=tuple(levels[f.name]), usual=_usual_index(f, levels[f.name]))
                 for f in factors), exclusions


def given_levels(factors: tuple[Factor, ...], narrowing: Narrowing) -> tuple[dict[str, list[Level]], set[str]]:
    """Each factor's levels under the run's fields, and the factors they decide: a world size keeps the splits of
    that many ranks; a field the run fixes keeps its level (or becomes the factor's one level, a value no level has);
    a --shape decides every geometry factor."""
    fixed = narrowing.fixed
    levels = {f.name: list(f.levels) for f in factors}
    given = set()
    for f in factors:
        if f.name == SPLIT and narrowing.world_size is not None:
            levels[f.name] = world_levels(f, narrowing.world_size)
        value = _given_value(f, fixed)
        if value is not None:
            levels[f.name] = [lv for lv in f.levels if lv.value == value] or [Level(value, GIVEN)]
            given.add(f.name)
        elif f.fields is None and "shape" in fixed:
            given.add(f.name)  # geometry, which the run's shape fixes
    return levels, given


def limited_levels(factors: tuple[Factor, ...], levels: dict[str, list[Level]], given: set[str],
                   narrowing: Narrowing) -> dict[str, list[Level]]:
    """What the implementation takes narrows the levels the run left open (its own fields win); a limit that takes
    one value no level has makes it the factor's level; one that leaves a factor nothing is the run's error."""
    levels = dict(levels)
    for lim in (lim for lim in narrowing.limits if lim.name not in narrowing.fixed):
        for f in factors:
            if f.name in given:
                continue
            kept = [lv for lv in levels[f.name] if lim.allows_level(f, lv.value)]
            if not kept and f.name == lim.name and lim.takes is not None and len(lim.takes) == 1:
                kept = [Level(lim.takes[0], lim.why)]  # (a value no level has, as a run's --eps 3e-4 is)
            if not kept:
                raise UsageError(f"no level of {f.name} is left: {lim.why}")
            levels[f.name] = kept
    return levels


def kept_exclusions(factors: tuple[Factor, ...], exclusions: tuple[Exclusion, ...], given: set[str],
                    narrowing: Narrowing) -> tuple[Exclusion, ...]:
    """The exclusions still to respect: the run asked for the values of factors it fixes together; a factor whose
    field it fixes (groups) has levels that were labels of the values it replaced (the trial cases' validity says what
    meets them); a smaller element bound scales the size exclusions."""
    replaced = {f.name for f in factors if f.field is not None and f.field in narrowing.fixed}
    kept = tuple(e for e in exclusions if not set(e.factors) <= given and not set(e.factors) & replaced)
    return tuple(e.scaled(narrowing.element_scale) for e in kept) if narrowing.element_scale is not None else kept


@dataclass(frozen=True)
class Trials:
    """The trial case of one factor's level: the other factors filled in `order` at their usual surviving levels that
    fit the exclusions, built under the run's fields (`build`)."""
    order: tuple[Factor, ...]
    exclusions: tuple[Exclusion, ...]
    build: Build

    def of(self, levels: dict[str, list[Level]], name: str, value) -> tuple[dict, Any, UsageError | None]:
        """(row, its case or None, the error that refused it)."""
        row = {name: value}
        for f in self.order:
            if f.name in row:
                continue
            fitting = [lv.value for lv in _usual_first(f, levels[f.name]) if fits(self.exclusions, row, f.name, lv.value)]
            if not fitting:
                return row, None, None
            row[f.name] = fitting[0]
        try:
            return row, self.build(row), None
        except UsageError as e:
            other = self._other_companion(levels, name, row)
            return other if other is not None else (row, None, e)

    def _other_companion(self, levels: dict[str, list[Level]], name: str, row: dict):
        """The usual companions may clash with the run's fields (--group-size 3 with a row of 16): the row with
        another level of one of them that builds, or None."""
        for f in self.order:
            for lv in ([] if f.name == name else _usual_first(f, levels[f.name])[1:]):
                rest = {k: v for k, v in row.items() if k != f.name}  # (they fit each other: the fill checked them)
                if fits(self.exclusions, rest, f.name, lv.value):
                    other = {**row, f.name: lv.value}
                    try:
                        return other, self.build(other), None
                    except UsageError:
                        continue
        return None


# Read-back passes after the first before a narrowing gives up settling (each pass can only take levels away)
READ_BACK_PASSES = 3


def survivors(factors: tuple[Factor, ...], levels: dict[str, list[Level]], trials: Trials) -> dict[str, list[Level]]:
    """The levels whose trial case is valid and reads them back: first each level its own value alone (a factor none
    of whose levels survive takes the value the run's cases read: a --shape's rows), then every factor read back, pass
    after pass until no level goes."""
    levels = dict(levels)
    first_error = [None]

    def one_pass(own_only: bool) -> bool:
        changed = False
        for f in trials.order:  # (the geometry first: a --shape's sizes are read before the factors they decide)
            kept = []
            for lv in levels[f.name]:
                row, case, error = trials.of(levels, f.name, lv.value)
                first_error[0] = first_error[0] or error
                names = [f] if own_only else factors
                if case is not None and all(g.read(case) == row[g.name] for g in names):
                    kept.append(lv)
            if not kept and own_only:
                kept = _read_level(f, levels, trials)
            if not kept:
                raise first_error[0] or UsageError(f"no case of the sweep takes the run's options ({f.name} has no level)")
            changed |= kept != levels[f.name]
            levels[f.name] = kept
        return changed

    one_pass(own_only=True)
    for _ in range(READ_BACK_PASSES):
        if not one_pass(own_only=False):
            break
    return levels


def fits(exclusions, row: dict, name: str, value) -> bool:
    """Whether `value` of factor `name` may meet every value already in `row`."""
    full = {**row, name: value}
    return all(e.allowed(full[e.factors[0]], full[e.factors[1]]) for e in exclusions
               if name in e.factors and set(e.factors) <= set(full))


def _given_value(f: Factor, fixed: dict):
    """The level of a factor whose case fields the run gives all of (a dtype, a layout, a split), else None."""
    if f.fields is None:
        return None
    keys = list(f.fields(f.values[0]))
    if not set(keys) <= set(fixed):
        return None
    return fixed[keys[0]] if len(keys) == 1 else tuple(fixed[k] for k in keys)


def _read_level(f: Factor, levels: dict, trials: Trials) -> list[Level]:
    """The one level a factor has where the run's fields decide it: the value the first case built from one of its
    levels (the usual first) reads."""
    for lv in _usual_first(f, levels[f.name]):
        row, case, error = trials.of(levels, f.name, lv.value)
        if case is not None:
            return [Level(f.read(case), GIVEN)]
    return []


def _usual_first(f: Factor, kept: list[Level]) -> list[Level]:
    usual = [lv for lv in kept if lv.value == f.values[f.usual]]
    return usual + [lv for lv in kept if lv not in usual]


def _usual_index(f: Factor, kept: list[Level]) -> int:
    return next((i for i, lv in enumerate(kept) if lv.value == f.values[f.usual]), 0)


def world_levels(f: Factor, size: int) -> list[Level]:
    """A split factor's levels of `size` ranks; where it declares none, each total it declares as even as it
    divides over them, and with the last rank empty."""
    kept = [lv for lv in f.levels if len(lv.value) == size]
    if kept:
        return kept
    out = {}
    for total in sorted({sum(lv.value) for lv in f.levels}):
        out.setdefault(_even(total, size), f"{total} over {size} ranks, as even as it divides")
        if size > 1:
            out.setdefault(_even(total, size - 1) + (0,), f"{total} over {size} ranks, the last empty")
    return [Level(v, why) for v, why in out.items()]


def _even(total: int, size: int) -> tuple[int, ...]:
    return tuple(total // size + (r < total % size) for r in range(size))
