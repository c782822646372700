"""What an implementation cannot do, learned before its sweep, so that the sweep's design narrows to what it takes.

The covering design promises every pair of levels in some case, but only the cases that are judged keep that promise:
a kernel that is only once differentiable skips every order-2 case, and the pairs those cases carried would be judged
by none. So its explicit signals narrow the design, as a run's options do (cases.narrowing.Limit), and the covering
array covers every pair again inside what it takes. The signals, and only these:

* the cases its record says it skips (`Bound.unsupported`: the orders and modes it implements, its support rule);
* `normcheck.Unsupported` raised on a probe case (NotDifferentiable: a backward that is only once differentiable, a
  forward without a forward-mode formula; a layer whose constructor cannot express the case).

cases.probing chooses the probe cases and reads the answers as limits; here is what asking the implementation means.
An arbitrary exception is never a signal: a kernel that crashes on 3-D input FAILs those cases in the sweep. A
distributed op's implementation is probed by its record alone (each run would start a world of ranks); probing is
measured apart from the run's time limit and runs the implementation for PROBE_SECONDS at most, or until
FAILING_PROBES probes failed; past that, what its record declares is still read (it costs no run).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from time import perf_counter

from ..cases.narrowing import Narrowing
from ..cases.probing import Answer, probed_narrowing
from ..core.errors import CaseTimeout, Unsupported, UsageError
from ..engine.compare import case_inputs
from ..ops import Bound, Op

# What probing may cost a run: its wall seconds, and the probes that fail (each restarts the implementation's worker
# or world) before it stops. A kernel that fails its probes is judged by its sweep, not learned from.
PROBE_SECONDS = 5.0
FAILING_PROBES = 3


def learned(op: Op, bound: Bound, narrowing: Narrowing) -> Narrowing:
    """The run's `narrowing` of the `op`'s design with the limits a `bound` implementation declares or says on probe
    cases (cases.probing). A limit that would leave a factor no level is not taken (the sweep's SKIP rows then say
    why)."""
    with bound.limit.aside() if bound.limit is not None else nullcontext():
        return probed_narrowing(op, narrowing, AskedBound(bound))


@dataclass
class Budget:
    """When probing stops: a wall-clock deadline, PROBE_SECONDS after the first probe's answer (which carries the
    implementation's start-up: its worker, its imports), and the failing probes left."""
    deadline: float | None = None
    failures_left: int = FAILING_PROBES

    @property
    def spent(self) -> bool:
        return (self.deadline is not None and perf_counter() > self.deadline) or self.failures_left <= 0

    def answered(self) -> None:
        if self.deadline is None:
            self.deadline = perf_counter() + PROBE_SECONDS


@dataclass
class AskedBound:
    """A `bound` implementation as cases.probing asks it (cases.probing.Asked): each probe case runs once, within
    the `budget`."""
    bound: Bound
    budget: Budget = field(default_factory=Budget)
    said: dict = field(default_factory=dict)  # case -> what the implementation said of it (declined's)

    @property
    def spent(self) -> bool:
        return self.budget.spent

    def answer(self, case) -> Answer | None:
        """What the implementation says of `case` (declined's), asked once; past the budget, what its record declares
        (it costs no run)."""
        if case not in self.said and self.budget.spent:
            reason = self.bound.unsupported(case)
            return (reason, {}, {}) if reason else None
        if case not in self.said:
            try:
                self.said[case] = declined(self.bound, case)
            except Failed:
                self.said[case] = None
                self.budget.failures_left -= 1
            self.budget.answered()
        return self.said[case]


def declined(bound: Bound, case) -> Answer | None:
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
