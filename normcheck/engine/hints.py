"""Hints: the declarations of conventions that would make a failing row pass (a hint, never a verdict).

A layer that is right under a convention it did not declare (float32 compute, y promoted with its parameters,
Gemma's 1 + w, channels-first sets, ...) fails, and its row says how, not what to declare. On a FAIL, `HintSearch`
judges the same case again under the other values of each convention the op takes (Op.conventions) and the
implementation did not declare (Impl.follows), and names the set of declarations under which it passes. Several at
once are searched greedily: every single one first; when none passes, the one that helped most (an interface error
gone, or the worst budget ratio down by HELPS) is adopted and the rest are searched on top of it, until nothing
helps. A hint explains the error on every output: no output that passed is further under it from what the
implementation computed (GROWS: a casting chain whose wider budget took dx's ratio under 1 while y's error grew
1.4-2.2x was hinted for a mean of squares accumulated in float16), and a declaration that only widens the budget (compute_dtype: the same
errors, judged against more) explains errors of the size it allows, not far smaller ones (PLAUSIBLE): those are a bug
the wider budget would hide. The row stays FAIL.

Its cost is bounded per bound run (one HintSearch per binding: Bound.hints): nothing on a passing row, nor on one
that ran out of its time limit; a full search on at most SEARCHES failing rows that no hint explained; a set that
explained a row is tried first on later ones (one probe), and after the budget it is the only thing tried; a probe
that runs out of its time limit ends the run's probing.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import inf, isnan
from typing import Any, Callable

from ..core.errors import UsageError
from .report import FAIL, MISTRUSTED, PASS, Report

SEARCHES = 3  # failing rows per bound run that get a full search
HELPS = 4.0   # a probe whose worst budget ratio falls by this factor helped: the search builds on it
# A declaration that only widens the budget (the same errors: compute_dtype) explains errors of at least this ratio
# under it: float32 code judged on float64 rows measured 0.005 to 0.5; naive variance in float64 (a bug) 1e-9 to 1e-6
PLAUSIBLE = 1e-3
# Under declarations that explain a row, an output that passed without them has at most this factor of its error: the
# reference they make is what the implementation computed. (A failing output's error may grow: an f32 layer's f64 rows
# are f32 rounding against either reference, 1.0-2.1x apart; a casting chain it does not follow grew y's 1.4-2.2x.)
GROWS = 1.125


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


@dataclass
class HintSearch:
    """One bound run's hint search (Bound.hints, made by binding; shared by the bindings replace() makes of it)."""
    searches: int = SEARCHES  # full searches left
    explained: list[dict] = field(default_factory=list)  # the declaration sets that made a row pass
    probed: list[dict] = field(default_factory=list)     # every probe's declarations, in order (what tests count)
    hung: bool = False  # a probe ran out of its time limit: no more probes in this run (each would wait one out)

    @property
    def probes(self) -> int:
        return len(self.probed)

    def hint(self, case, bound, report: Report, judge: Callable[[Any, Any], Report]) -> Hint | None:
        """The declarations under which the FAIL `report` of the bound implementation on `case` passes (None: none
        found, or not searched). `judge(case, bound)`: the engine's judge, run on each probe with hints off."""
        if report.verdict != FAIL or ran_out(report) or self.hung:
            return None  # (no declaration explains a hang; each probe of one would wait out a limit)
        if report.tensors and not any(t.verdict == FAIL for t in report.tensors):
            return None  # (its values pass: a promise failed, determinism or batch invariance, which no convention explains)
        probe = _Prober(case, replace(bound, hints=None), judge, self)
        for known in self.explained:
            declared = {k: v for k, v in known.items() if getattr(case, k) != v}
            if declared and explains(report, probe(declared)):
                return hint_of(case, declared)
        if self.searches <= 0:
            return None
        self.searches -= 1
        found = search(alternatives(case, bound.impl), report, probe)
        if found is None:
            return None
        self.explained.append(found)
        return hint_of(case, found)


@dataclass
class _Prober:
    """Judges `case` again under some declarations: the Report, or None when no such case exists (Case refuses it),
    the implementation skips it (it is not tried) or it ran out of its time limit (and the run probes no more)."""
    case: Any
    bound: Any
    judge: Callable
    state: HintSearch

    def __call__(self, declared: dict) -> Report | None:
        try:
            case = replace(self.case, **declared)
        except UsageError:
            return None
        if self.state.hung or self.bound.unsupported(case):
            return None
        self.state.probed.append(dict(declared))
        try:
            probed = self.judge(case, self.bound)
        except UsageError:  # (a world that cannot run it)
            return None
        self.state.hung = ran_out(probed)
        return None if self.state.hung else probed


def ran_out(report: Report) -> bool:
    """The implementation ran out of the case's time limit (it did not finish)."""
    return report.time_limit is not None and report.seconds >= report.time_limit


def alternatives(case, impl) -> dict[str, tuple]:
    """Each convention the op takes and the implementation's record (an Impl) did not declare -> the other values to
    try."""
    declared = dict(impl.follows)
    found = {}
    for f in case.record.conventions:
        values = tuple(v for v in f.probed if v != getattr(case, f.name))
        if f.name not in declared and values:
            found[f.name] = values
    return found


def search(remaining: dict[str, tuple], report: Report, probe: Callable) -> dict | None:
    """Greedily, the declarations under which the row passes (None: nothing helps)."""
    adopted, best = {}, report
    while remaining:
        helped = []  # (gain, name, value, report)
        for name, values in remaining.items():
            for value in values:
                trial = {**adopted, name: value}
                probed = probe(trial)
                if probed is None:
                    continue
                if passes(probed):
                    if explains(best, probed):
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


def passes(report: Report | None) -> bool:
    return report is not None and report.verdict in (PASS, MISTRUSTED)


def explains(before: Report, after: Report | None) -> bool:
    """The row judged under some declarations (`after`) passes, and they explain its failure (`before`): they changed
    what it is compared with, or, where they only widened its budget (the same errors), the errors are of the size
    the wider budget is for. A smaller one is a bug in a finer precision that the wider budget hides."""
    if not passes(after) or further(before, after):
        return False
    return not same_errors(before, after) or worst_ratio(after) >= PLAUSIBLE


def further(before: Report, after: Report) -> list[str]:
    """The outputs that passed in `before` and whose error grew under the declarations (GROWS): what the declarations
    make of them is not what was computed, however much they widen another output's budget."""
    passed = {t.name: t.max_abs_error for t in before.tensors if t.max_ratio <= 1}
    return [name for name, error in errors(after).items() if name in passed and error > passed[name] * GROWS]


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
    fields = {f.name: f for f in case.record.conventions}
    return Hint(tuple(declared.items()), tuple(fields[name].meaning(value) for name, value in declared.items()))
