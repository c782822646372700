"""Hints: the declarations of conventions that would make a failing row pass (a hint, never a verdict).

A layer that is right under a convention it did not declare (float32 compute, y promoted with its parameters,
Gemma's 1 + w, channels-first sets, a frozen BatchNorm's eval mode, ...) fails, and its row says how, not what to
declare. On a FAIL, `HintSearch` judges the same case again under the other values of each convention the op takes
(Op.hinted: its conventions, and eval mode where it keeps running statistics) and the implementation did not declare
(Impl.follows), and names the set of declarations under which it passes. Several at once are searched greedily: every
single one first; when none passes, the one that helped most (an interface error gone, or the worst budget ratio down
by HELPS) is adopted and the rest are searched on top of it, until nothing helps. The row stays FAIL. Eval mode is
judged on the row's own call, in training mode, against eval mode's expectations (CaseField.as_called): a frozen
BatchNorm normalises with its running statistics whatever it is asked; a BatchNorm with a bug in its batch statistics,
which eval mode never computes, gets no hint.

A declaration that only widens the budget (compute_dtype f32 on float64 input: the same errors, judged against more)
explains a row only where its errors are of the size the wider budget is for (PLAUSIBLE, the worst output's: a float64
bug a few ulps wide is a billionth of float32's budget; an output's own ratio says less, a long float32 sum's being
1e-6 of its bound), judged against the same reference (eps=None pinned to the number it meant: float32 compute also
means float32's eps there, a shift of float32's size on every output that excused any error), and, where the search
finds it, the row passes at another eps too (a layer that ignores eps is off by about eps / (2·mean square),
float32-sized at a small eps by luck), or, where the implementation takes one eps only (a probe it skips is no
verdict), on data whose statistic is about that eps.

A declaration under which every set is one value, where the row's sets held several (channels-first sets over a dim
of size 1), is not searched for: the normalisation of one value is x/√(x² + eps) (0 where centred) whichever dims
hold it, so a pass there tells the declared sets from no others, and it drops every error a set makes (a casting
chain's x̂ is ±1, exact in any dtype). A layer built from the declared sizes passes it whatever dims it normalises:
Mamba2's gated RMSNorm (its last dim, its group size prod(normalized_shape)) was hinted channels-first sets on a
1x1x1x7x4096 row, where it was built with groups of one value; its rows fail by their casting chain. Such a row
carries a set found on a row where its declarations were judged on sets of several values (a channels-first
layer's 4-D rows with C = 1 do, once a row with C > 1 found it), and its search starts from such a declaration
(given): what the row needs beyond it is searched on top, and judged as on any row (ViTDet's mixed rows of one
channel need y promoted with its float32 parameters too, which no row of several channels found: in half precision
its statistics fail them whatever is declared).

Rows that fail alike (one kind: the input's rank, the dtype class, and how they fail: by their values, or with one
message whatever its numbers) are explained alike. Every failing row is judged again under what explained its kind,
then under what explained any other (one probe each; where that explains a row of a new kind, less what the row does
without, and its kind keeps that); a kind nothing explained yet gets one full search: every row a found set explains
carries it. Rows of a wrong rank are a kind of their own, and never use up another kind's search.
A hint explains the error on every output: no output that passed is further under it from what the
implementation computed (GROWS: a casting chain whose wider budget took dx's ratio under 1 while y's error grew
1.4-2.2x was hinted for a mean of squares accumulated in float16).

Its cost is bounded per bound run (one HintSearch per binding: Bound.hints): nothing on a passing row, nor on one
that ran out of its time limit; a full search for at most SEARCHES kinds, each on a row of at most SEARCH_NUMEL
elements; a probe that runs out of its time limit ends the run's probing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from math import inf, isnan
from typing import Any, Callable

import numpy as np

from ..core.errors import UsageError
from ..numerics.dtypes import UNIT_ROUNDOFF
from ..ops.design import dtype_class
from .report import FAIL, MISTRUSTED, PASS, SKIP, Report

SEARCHES = 16  # kinds of failure per bound run that get a full search (each input rank by dtype class, a few messages)
# A search judges its row about ten times: it runs on a row of at most this many elements; a larger row of a kind not
# yet explained is judged only under what explained other rows, and its kind waits for a smaller row
SEARCH_NUMEL = 1 << 18
# A kind whose search found nothing while a declaration made its row's sets one value each (untellable) waits for
# another of its rows, this many times at most (ViTDet's and timm's channels-first rows of one channel come first); past
# them it is closed until a set is found that its rows may take as given (HintSearch._reopen)
DEFERRALS = 3
HELPS = 4.0   # a probe whose worst budget ratio falls by this factor helped: the search builds on it
# A declaration that only widens the budget (the same errors: compute_dtype) explains errors of at least this ratio
# under it: float32 code judged on float64 rows measured 0.005 to 0.5; naive variance in float64 (a bug) 1e-9 to 1e-6
PLAUSIBLE = 1e-3
# Under declarations that explain a row, an output that passed without them has at most this factor of its error: the
# reference they make is what the implementation computed. (A failing output's error may grow: an f32 layer's f64 rows
# are f32 rounding against either reference, 1.0-2.1x apart; a casting chain it does not follow grew y's 1.4-2.2x.)
GROWS = 1.125
# ...unless it stays within this many float64 units of roundoff of the value: the references a declaration makes
# differ by their own rounding there, whatever the implementation computed
REFERENCE_NOISE = 32
BUDGET_NOISE = 1e-2  # ...or under this fraction of the row's own budget for it, grown as it did
# The eps a widening is judged at again (or a hundred times the row's, where larger): float32 code passes there as
# anywhere; a layer that ignores eps is off by ~eps/(2·mean square), far beyond float32's budget at data of unit size
OTHER_EPS = 1e-2
# Where an implementation takes one eps only, the data a widening is judged on again: the statistic about eps
EPS_PROFILE = "near_constant"


def option(name: str, value) -> str:
    """How the command line declares a convention: --compute-dtype f32, --weight-offset 1."""
    return f"--{name.replace('_', '-')} {value_text(value)}"


def value_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Hint:
    """Declarations under which a failing row passes: (convention, value) pairs, and what following each means."""
    declarations: tuple[tuple[str, Any], ...]
    meanings: tuple[str, ...]

    def text(self, spell: Callable[[str, Any], str] = option) -> str:
        """The hint in one line; `spell(name, value)` writes a declaration as a front end takes it."""
        declared = " ".join(spell(name, value) for name, value in self.declarations)
        does = " and ".join(self.meanings)
        it = "them" if len(self.declarations) > 1 else "it"
        return (f"it passes with {declared} declared (the implementation {does}): declare {it} if that is how it is "
                "written")

    def __str__(self) -> str:
        return self.text()


def kind_of(case, report: Report) -> tuple:
    """Rows that fail alike: the input's rank, the dtype class, and how they fail (by their values, or the message with
    its numbers and the words that end in one taken out: one shape error, one exception, one wrong dtype, at every
    size and in every dtype)."""
    how = "values" if any(t.verdict == FAIL for t in report.tensors) else re.sub(r"\w*\d+", "#", report.message)
    return len(case.shape), dtype_class((case.dtype, case.param_dtype)), how


@dataclass
class HintSearch:
    """One bound run's hint search (Bound.hints, made by binding; shared by the bindings replace() makes of it)."""
    searches: int = SEARCHES  # full searches left
    kinds: dict = field(default_factory=dict)            # each kind searched -> the declarations found (None: none)
    explained: list[dict] = field(default_factory=list)  # the declaration sets that made a row pass, in order
    probed: list[dict] = field(default_factory=list)     # every probe's declarations, in order (what tests count)
    hung: bool = False  # a probe ran out of its time limit: no more probes in this run (each would wait one out)
    deferred: dict = field(default_factory=dict)         # kind -> its searches that found nothing on one-value sets
    untold: set = field(default_factory=set)  # kinds closed so, past their deferrals, until a set is found (_reopen)

    @property
    def probes(self) -> int:
        return len(self.probed)

    def hint(self, case, bound, report: Report, judge: Callable[[Any, Any], Report]) -> Hint | None:
        """The declarations under which the FAIL `report` of the bound implementation on `case` passes (None: none
        found, or not searched). `judge(case, bound, against)`: the engine's judge, run on each probe with hints off
        (`against`: the case whose expectations it is judged against, where not its own)."""
        if report.verdict != FAIL or ran_out(report) or self.hung:
            return None  # (no declaration explains a hang; each probe of one would wait out a limit)
        if report.tensors and not any(t.verdict == FAIL for t in report.tensors):
            return None  # (its values pass: a promise failed, determinism or batch invariance, which no convention explains)
        probe = _Prober(case, replace(bound, hints=None), judge, self, report)
        kind = kind_of(case, report)
        own = self.kinds.get(kind)
        for known in ([own] if own else []) + [k for k in self.explained if k != own] + self._together():
            declared = {k: v for k, v in known.items() if getattr(case, k) != v}
            if declared and probe.explains(declared, report):
                if kind not in self.kinds:  # (a new kind: what explained another, less what this row does without)
                    declared = self.kinds[kind] = self._spelled(minimal(declared, report, probe))
                return hint_of(case, declared)
        if kind in self.kinds or self.searches <= 0 or case.numel > SEARCH_NUMEL:
            return None
        self.searches -= 1
        found = self._spelled(search(alternatives(case, bound.impl), probe))
        if found is None and probe.untellable:
            if self.deferred.get(kind, 0) < DEFERRALS:
                # (a declaration its sets could not tell apart, one value each: a later row of its kind is searched)
                self.deferred[kind] = self.deferred.get(kind, 0) + 1
                self.searches += 1
                return None
            self.untold.add(kind)
        self.kinds[kind] = found
        return None if found is None else hint_of(case, found)

    def _together(self) -> list[dict]:
        """Every set found, together, where they were found apart and agree (a frozen BatchNorm's float32 rows found
        --mode eval and its mixed rows --output-dtype promote alone; its f16/f32 rows of order 2 need both)."""
        together = {}
        for found in self.explained:
            if any(together.get(k, v) != v for k, v in found.items()):
                return []
            together.update(found)
        return [together] if len(self.explained) > 1 and together not in self.explained else []

    def _spelled(self, found: dict | None) -> dict | None:
        """A set found again keeps its first spelling (one hint reads alike on every row); a new one is kept."""
        if found is None:
            return None
        known = next((known for known in self.explained if known == found), None)
        if known is None:
            self.explained.append(found)
            self._reopen()
        return known or found

    def _reopen(self):
        """A set found is what a row of one-value sets may take as given (_Prober.given): each kind whose search found
        nothing on such rows is searched again on its next row (ViTDet's mixed rows of one channel had used up their
        deferrals before a float32 row of several channels found channels-first sets)."""
        for kind in self.untold:
            del self.kinds[kind]
            self.deferred.pop(kind, None)
        self.untold.clear()


@dataclass
class _Prober:
    """Judges `case` (its FAIL report: `row`) again under some declarations: the Report, or None when no such case
    exists (Case refuses it), the implementation skips it (it is not tried) or it ran out of its time limit (and the run
    probes no more). Each set is judged once."""
    case: Any
    bound: Any
    judge: Callable
    state: HintSearch
    row: Report
    seen: dict = field(default_factory=dict)  # the declarations, as a frozenset of items -> their Report (or None)
    untellable: bool = False  # a declaration was not judged: under it the row's sets were one value each

    def __post_init__(self):
        self.seen[frozenset()] = self.row

    def __call__(self, declared: dict) -> Report | None:
        key = frozenset(declared.items())
        if key not in self.seen:
            self.seen[key] = self._judged(declared)
        return self.seen[key]

    def _judged(self, declared: dict) -> Report | None:
        fields = {f.name: f for f in self.case.record.hinted}
        called = {k: v for k, v in declared.items() if not (k in fields and fields[k].as_called)}
        try:
            case = replace(self.case, **called)
            against = replace(case, **declared) if called != declared else None  # (the call as the row made it)
        except UsageError:
            return None
        if self.state.hung or self.bound.unsupported(case):
            return None
        self.state.probed.append(dict(declared))
        try:  # (a declaration the data does not fit overflows its expectations: float32 compute of a big float64 row)
            with np.errstate(over="ignore", invalid="ignore"):
                probed = self.judge(case, self.bound, against)
        except UsageError:  # (a world that cannot run it)
            return None
        self.state.hung = ran_out(probed)
        return None if self.state.hung or probed.verdict == SKIP else probed

    def explains(self, declared: dict, before: Report, elsewhere: bool = False) -> bool:
        """Judged under `declared`, the row passes, and they explain its failure (`before`: its report under the
        declarations the search had adopted, or the row's): they changed what it is compared with, or, where they
        only widened its budget (the same errors), the errors are of the size the wider budget is for. Where one of
        them coarsens the precision the case accumulates in, that size is read against the same reference (eps=None,
        which means the coarser precision's eps there, pinned to the number it meant), and (`elsewhere`: where the
        search finds the set) the row passes at another eps too."""
        after = self(declared)
        if not passes(after) or further(before, after):
            return False
        if not any(self.coarsens(k, v) for k, v in declared.items()):
            return not same_errors(before, after) or worst_ratio(after) >= PLAUSIBLE
        rest = {k: v for k, v in declared.items() if not self.coarsens(k, v)}
        same = after if self.case.eps is not None else self({**declared, "eps": replace(self.case, **rest).eps_value})
        if not passes(same) or worst_ratio(same) < PLAUSIBLE:
            return False
        return not elsewhere or self.at_other_eps(declared)

    def one_value_sets(self, declared: dict, given: dict | None = None) -> bool:
        """Under `declared` every set is one value, where the row's sets held several: a pass there tells the declared
        sets from no others (any normalisation of one value is the same), so the search does not judge it; unless
        the declarations that make them so are `given` (found where sets held several)."""
        untold = dict(declared.items() - (given or {}).items())
        try:
            probed = replace(self.case, **untold)
        except UsageError:
            return False
        return probed.view.set_size == 1 < self.case.view.set_size

    def given(self) -> dict:
        """The declarations of a set found so far (HintSearch.explained) under which this row's sets are one value
        each: found on rows whose sets held several, so taken as given on a row that cannot tell them apart."""
        for found in self.state.explained:
            told = {k: v for k, v in found.items() if self.one_value_sets({k: v})}
            if told:
                return told
        return {}

    def coarsens(self, name: str, value) -> bool:
        """Declaring `name` = `value` makes the case accumulate in a coarser precision (compute_dtype f32 on f64)."""
        try:
            probed = replace(self.case, **{name: value})
        except UsageError:
            return False
        return UNIT_ROUNDOFF[probed.dtypes.accumulation] > UNIT_ROUNDOFF[self.case.dtypes.accumulation]

    def at_other_eps(self, declared: dict) -> bool:
        """The row passes under `declared` at a far larger eps too (OTHER_EPS, or a hundred times its own); where it
        cannot be judged there (an implementation that takes one eps only: OLMo's LayerNorm writes eps=1e-5), on data
        whose statistic is about its eps (EPS_PROFILE), where an eps of another form or none is off by the data's own
        size (F.normalize's floor judged as RMSNorm's eps); True where it cannot be judged there either."""
        other = self({**declared, "eps": max(OTHER_EPS, 100 * self.case.eps_value)})
        if other is None and self.case.profile != EPS_PROFILE:
            other = self({**declared, "profile": EPS_PROFILE})
        return other is None or passes(other)


def ran_out(report: Report) -> bool:
    """The implementation ran out of the case's time limit (it did not finish)."""
    return report.time_limit is not None and report.seconds >= report.time_limit


def alternatives(case, impl) -> dict[str, tuple]:
    """Each convention the op takes (and eval mode where it keeps running statistics: Op.hinted) that the
    implementation's record (an Impl) did not declare -> the other values to try."""
    declared = dict(impl.follows)
    found = {}
    for f in case.record.hinted:
        values = tuple(v for v in f.probed if v != getattr(case, f.name))
        if f.name not in declared and values:
            found[f.name] = values
    return found


def search(remaining: dict[str, tuple], probe: _Prober) -> dict | None:
    """Greedily, the declarations under which the row passes (None: nothing helps), from what is given (_Prober.given:
    a declaration found where sets held several, under which this row's are one value each)."""
    given = probe.given()
    start = probe(given) if given else None
    if passes(start):
        return given if probe.explains(given, probe.row, elsewhere=True) else None
    adopted, best = (dict(given), start) if start is not None else ({}, probe.row)
    remaining = {k: v for k, v in remaining.items() if k not in adopted}
    while remaining:
        helped = []  # (gain, name, value, report)
        for name, values in remaining.items():
            for value in values:
                trial = {**adopted, name: value}
                if probe.one_value_sets(trial, given):
                    probe.untellable = True
                    continue  # (sets of one value tell no declared sets from others: nothing found or built on)
                probed = probe(trial)
                if probed is None:
                    continue
                if passes(probed):
                    if probe.explains(trial, best, elsewhere=True):
                        return trial
                    continue  # (it passes only under a budget its errors do not need: nothing to build on)
                gain = gain_of(best, probed)
                if gain is not None:
                    helped.append((gain, name, value, probed))
        if not helped:
            return None
        _, name, value, best = max(helped, key=lambda h: h[0])
        adopted[name] = value
        remaining = {k: v for k, v in remaining.items() if k != name}
    return None


def minimal(declared: dict, report: Report, probe: _Prober) -> dict:
    """`declared` (which explains the row) less each declaration the row passes without, one at a time."""
    for name in list(declared):
        fewer = {k: v for k, v in declared.items() if k != name}
        if len(declared) > 1 and probe.explains(fewer, report):
            declared = fewer
    return declared


def passes(report: Report | None) -> bool:
    return report is not None and report.verdict in (PASS, MISTRUSTED)


def further(before: Report, after: Report) -> list[str]:
    """The outputs that passed in `before` and whose error grew under the declarations (GROWS): what the declarations
    make of them is not what was computed, however much they widen another output's budget. An error that stays
    within the float64 reference's own rounding grows by chance: within REFERENCE_NOISE units of roundoff of the
    value, or under BUDGET_NOISE of the row's own budget for it (a frozen BatchNorm's float64 dbias, a sum of 191
    values, 2.4e-15 off in train mode and 4.4e-15 in eval mode: 0.005 and 0.009 of its budget, the same sum)."""
    passed = {t.name: t for t in before.tensors if t.max_ratio <= 1}
    grown = []
    for t in after.tensors:
        was = passed.get(t.name)
        if was is None or t.max_abs_error <= was.max_abs_error * GROWS:
            continue
        if t.max_abs_error <= REFERENCE_NOISE * UNIT_ROUNDOFF["f64"] * max(abs(t.got), abs(t.expected)):
            continue
        if was.max_abs_error > 0 and was.max_ratio * t.max_abs_error / was.max_abs_error < BUDGET_NOISE:
            continue
        grown.append(t.name)
    return grown


def same_errors(before: Report, after: Report) -> bool:
    """The same outputs against the same reference: every tensor's largest error as it was."""
    return bool(before.tensors) and errors(before) == errors(after)


def errors(report: Report) -> dict[str, float]:
    return {t.name: t.max_abs_error for t in report.tensors}


def gain_of(before: Report, after: Report) -> tuple | None:
    """How much `after` improves on `before` (None: it did not help; larger is better): outputs to compare where
    `before` had none (an interface error, a wrong dtype or return form), the closer the better; otherwise the
    factor its worst budget ratio fell by, at least HELPS."""
    if not after.tensors:
        return None
    if not before.tensors:
        return (1, -worst_ratio(after))
    after_ratio = worst_ratio(after)
    factor = worst_ratio(before) / after_ratio if after_ratio else inf
    return (0, factor) if factor >= HELPS else None  # (inf / inf is NaN: no help)


def worst_ratio(report: Report) -> float:
    """The worst budget ratio over its tensors, NaN counted as inf."""
    return max((inf if isnan(t.max_ratio) else t.max_ratio for t in report.tensors), default=0.0)


def hint_of(case, declared: dict) -> Hint:
    fields = {f.name: f for f in case.record.hinted}
    return Hint(tuple(declared.items()), tuple(fields[name].meaning(value) for name, value in declared.items()))
