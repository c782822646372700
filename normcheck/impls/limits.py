"""What an implementation cannot do, learned before its sweep, so that the sweep's design narrows to what it takes.

The covering design promises every pair of levels in some case, but only the cases that are judged keep that promise:
a kernel that is only once differentiable skips every order-2 case, and the pairs those cases carried would be judged
by none. So its explicit signals narrow the design, as a run's options do (cases.narrowing.Limit), and the covering
array covers every pair again inside what it takes. The signals, and only these:

* the cases its record says it skips (`Bound.unsupported`: the orders and modes it implements, its support rule);
* `normcheck.Unsupported` raised on a probe case (NotDifferentiable: a backward that is only once differentiable, a
  forward without a forward-mode formula; a layer whose constructor cannot express the case).

Each probe case is the usual case with one factor at another level (cases.sweep.probe_rows): declining it declines
that level, unless the exception says what it takes (Unsupported.takes / declines), which wins. An arbitrary
exception is never a signal: a kernel that crashes on 3-D input FAILs those cases in the sweep. A distributed op's
implementation is probed by its record alone (each run would start a world of ranks); probing is measured apart
from the run's time limit and runs the implementation for PROBE_SECONDS at most, or until FAILING_PROBES probes
failed; past that, what its record declares is still read (it costs no run).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from time import perf_counter

from ..cases.case import CONVENTIONS
from ..cases.narrowing import Limit, Narrowing
from ..cases.sweep import case_of, narrowed_design, probe_rows
from ..core.errors import CaseTimeout, Unsupported, UsageError
from ..engine.compare import case_inputs
from ..ops import Bound, Op

ROUNDS = 3  # a limit changes the usual levels the next probes start from; more rounds than this find nothing new
# What probing may cost a run: its wall seconds, and the probes that fail (each restarts the implementation's worker
# or world) before it stops. A kernel that fails its probes is judged by its sweep, not learned from.
PROBE_SECONDS = 5.0
FAILING_PROBES = 3


def learned(op: Op, bound: Bound, narrowing: Narrowing) -> Narrowing:
    """The run's `narrowing` of the `op`'s design with the limits a `bound` implementation declares or says on probe
    cases. A limit that would leave a factor no level is not taken (the sweep's SKIP rows then say why)."""
    said = {}  # case -> what the implementation said of it: each probe case runs once
    budget = Budget()
    with bound.limit.aside() if bound.limit is not None else nullcontext():
        for _ in range(ROUNDS):
            found = [lim for lim in probe(bound, op, narrowing, said, budget) if lim not in narrowing.limits]
            if not found and budget.every_probe_declined and narrowing.fields:
                # (the run's own options leave it nothing it takes: what it takes outside them says which option,
                # and the run's fields still win, engine.coverage.overruled)
                open_design = replace(narrowing, fields=tuple((k, v) for k, v in narrowing.fields if k in CONVENTIONS))
                return narrowing.with_limits(probe(bound, op, open_design, said, budget))
            if not found:
                break
            try:
                narrowed_design(op, narrowing.with_limits(found))
            except UsageError:
                break
            narrowing = narrowing.with_limits(found)
    return narrowing


@dataclass
class Budget:
    """When probing stops: a wall-clock deadline, PROBE_SECONDS after the first probe's answer (which carries the
    implementation's start-up: its worker, its imports), and the failing probes left."""
    deadline: float | None = None
    failures_left: int = FAILING_PROBES
    every_probe_declined: bool = False  # (the last probing found no case the implementation runs)

    @property
    def spent(self) -> bool:
        return (self.deadline is not None and perf_counter() > self.deadline) or self.failures_left <= 0

    def answered(self) -> None:
        if self.deadline is None:
            self.deadline = perf_counter() + PROBE_SECONDS


def probe(bound: Bound, op: Op, narrowing: Narrowing, said: dict, budget: Budget) -> list[Limit]:
    """The limits the `bound` implementation shows on the probe cases of the design `narrowing` leaves (`said`:
    case -> what it said, kept between rounds), within `budget`. Levels are probed from a case it runs (the usual one, else the first probe
    it runs): a plain decline of a case one level away from that case declines that level."""
    rows = probe_rows(op, narrowing)
    try:
        base = next((row for _, _, row in rows if row is not None and not budget.spent
                     and _said(bound, op, row, narrowing, said, budget) is None), None)
    except CaseTimeout:  # (a probe that hangs tells nothing; the sweep's own limits deal with the rest)
        return []
    budget.every_probe_declined = base is None and not budget.spent
    if base is not None and base != rows[0][2]:
        rows = probe_rows(op, narrowing, base)
    found = []
    for name, value, row in rows:  # (past the budget, what its record declares is still read: it costs no run)
        try:
            declines = _said(bound, op, row, narrowing, said, budget)
        except CaseTimeout:
            break
        if declines is None:
            continue
        reason, takes, declined_values = declines
        if takes or declined_values:
            found += [Limit(k, takes=v, why=reason) for k, v in takes.items()]
            found += [Limit(k, declines=v, why=reason) for k, v in declined_values.items()]
        elif name is not None and base is not None:
            found.append(Limit(name, declines=(value,), why=reason))
    return list(dict.fromkeys(found))


def _said(bound: Bound, op: Op, row: dict | None, narrowing: Narrowing, said: dict, budget: Budget):
    """What `bound` says of the case of `row` (declined: ...), asked once; None where it runs it (or no case is made)."""
    if row is None:
        return None
    try:
        case = case_of(op, row, 0, narrowing)
    except UsageError:
        return None
    if case not in said and budget.spent:
        reason = bound.unsupported(case)
        return (reason, {}, {}) if reason else None
    if case not in said:
        try:
            said[case] = declined(bound, case)
        except Failed:
            said[case] = None
            budget.failures_left -= 1
        budget.answered()
    return said[case]


def declined(bound: Bound, case) -> tuple[str, dict, dict] | None:
    """(why, what it takes, what it declines) when `bound` declines `case` (its record, or Unsupported when it runs);
    None when it runs it, whatever the outputs (the sweep judges those); Failed when it raised otherwise."""
    reason = bound.unsupported(case)
    if reason:
        return reason, {}, {}
    if case.record.distributed:  # (by its record alone: each run would start a world of ranks)
        return None
    try:
        bound.runner(case, case_inputs(case))
    except Unsupported as e:
        return str(e) or "the implementation declined the case", e.takes, e.declines
    except (CaseTimeout, UsageError):  # (bad input, a layer normcheck cannot bind: the run's one line, at once)
        raise
    except Exception:  # noqa: BLE001 - a failure is the sweep's to judge, never a signal
        raise Failed from None
    return None


class Failed(Exception):
    """A probe the implementation failed (raised, crashed): no signal, and it costs a restart."""
