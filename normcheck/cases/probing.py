"""The probe cases of what an implementation cannot do, and the limits its answers there give the design.

Each probe case is the usual case with one factor at another level (probe_rows); the implementation is asked about
each (Asked: impls.limits asks it). A plain decline of a case one level away from a case it runs declines that level,
unless the answer says what it takes or declines (Unsupported.takes / declines), which wins. The limits found narrow
the design as a run's options do (cases.narrowing.Limit), and the next round probes from the usual levels they leave.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from ..core.errors import CaseTimeout, UsageError
from ..ops import Op
from .case import CONVENTIONS, Case
from .narrowing import SPLIT, Limit, Narrowing
from .sweep import case_or_none, filled, narrowed_design, on_record

ROUNDS = 3  # a limit changes the usual levels the next probes start from; more rounds than this find nothing new

Answer = tuple[str, dict, dict]  # (why it declines the case, {name: the values it takes}, {name: values it declines})


class Asked(Protocol):
    """The implementation as probing asks it: `answer(case)` is its Answer where it declines `case`, None where it
    runs it; once `spent`, nothing more of it may be run, and `answer` says only what costs no run (what its record
    declares, what it said before). A probe that hangs raises CaseTimeout."""

    @property
    def spent(self) -> bool: ...

    def answer(self, case: Case) -> Answer | None: ...


def probed_narrowing(op: Op, narrowing: Narrowing, asked: Asked) -> Narrowing:
    """The run's `narrowing` of the `op`'s design with the limits the `asked` implementation shows on its probe cases,
    round after round until none is new. A limit that would leave a factor no level is not taken (the sweep's SKIP rows
    then say why)."""
    every_probe_declined = False  # (by the last probing that got as far as choosing its base)
    for _ in range(ROUNDS):
        limits, declined_all = probe(op, narrowing, asked)
        every_probe_declined = every_probe_declined if declined_all is None else declined_all
        found = [lim for lim in limits if lim not in narrowing.limits]
        if not found and every_probe_declined and narrowing.fields:
            # (the run's own options leave it nothing it takes: what it takes outside them says which option,
            # and the run's fields still win, engine.coverage.overruled)
            open_design = replace(narrowing, fields=tuple((k, v) for k, v in narrowing.fields if k in CONVENTIONS))
            return narrowing.with_limits(probe(op, open_design, asked)[0])
        if not found:
            break
        try:
            narrowed_design(op, narrowing.with_limits(found))
        except UsageError:
            break
        narrowing = narrowing.with_limits(found)
    return narrowing


def probe(op: Op, narrowing: Narrowing, asked: Asked) -> tuple[list[Limit], bool | None]:
    """(the limits the `asked` implementation shows on the probe cases of the design `narrowing` leaves, whether it
    declined every one: None where a probe hung before that was known). Levels are probed from a case it runs (the
    usual one, else the first probe it runs): a plain decline of a case one level away from that case declines that
    level."""
    rows = probe_rows(op, narrowing)
    try:
        base = next((row for _, _, row in rows if row is not None and not asked.spent
                     and _answer(op, row, narrowing, asked) is None), None)
    except CaseTimeout:  # (a probe that hangs tells nothing; the sweep's own limits deal with the rest)
        return [], None
    every_probe_declined = base is None and not asked.spent
    if base is not None and base != rows[0][2]:
        rows = probe_rows(op, narrowing, base)
    found = []
    for name, value, row in rows:  # (once spent, it still answers what costs no run)
        try:
            answer = _answer(op, row, narrowing, asked)
        except CaseTimeout:
            break
        if answer is None:
            continue
        why, takes, declines = answer
        if takes or declines:
            found += [Limit(k, takes=v, why=why) for k, v in takes.items()]
            found += [Limit(k, declines=v, why=why) for k, v in declines.items()]
        elif name is not None and base is not None:
            found.append(Limit(name, declines=(value,), why=why))
    return list(dict.fromkeys(found)), every_probe_declined


def _answer(op: Op, row: dict | None, narrowing: Narrowing, asked: Asked) -> Answer | None:
    """What the `asked` implementation answers of the case of `row`; None where it runs it, or no case is made."""
    case = case_or_none(op, row, narrowing)
    return None if case is None else asked.answer(case)


@on_record
def probe_rows(op: Op, narrowing: Narrowing = Narrowing(), base: dict | None = None
               ) -> tuple[tuple[str | None, object, dict | None], ...]:
    """(factor, value, row) of the cases an implementation's limits are probed on: the base row (factor None: `base`,
    or every factor at its usual level), then each other level of each factor with the others as in the base (or,
    where that meets an exclusion, at their usual levels), each size at the level just below its usual one (a probe
    needs the answer, not the work). The sizes' own levels (scanned factors) and a world's split are not probed: what a
    kernel declines there it declines by size, which no level of a design stands for, and each split would start a
    world."""
    fs, excluded = narrowed_design(op, narrowing)

    def row_of(given):
        return filled(op, given, fs, excluded, smaller=True) or filled(op, given, fs, excluded)

    base = base or row_of({})
    rows, seen = [(None, None, base)], [base]
    for f in fs:
        for value in (() if f.name == SPLIT or f.name in op.design.scans else f.values):
            row = (filled(op, {f.name: value}, fs, excluded, prefer=base) if base is not None else None) \
                or row_of({f.name: value})  # (the base's other levels wherever they meet this one)
            if row is not None and row not in seen:
                seen.append(row)
                rows.append((f.name, value, row))
    return tuple(rows)
