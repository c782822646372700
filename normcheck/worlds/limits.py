"""How long one case may run: an explicit --timeout, or a limit that follows what the run measured.

A case's yardstick is the float64 reference's own time on it, measured before the implementation runs, so it
needs nothing of the implementation: no case gets less than MULTIPLE times it. The first case also carries the
implementation's own start-up (a compile, a JIT-built extension, a framework's tracing), which no yardstick
predicts: it gets DEFAULT_TIMEOUT seconds (also what a world uses when nobody gives it a limit), but only while it
is starting up: a worker looks where the case is at FIRST_LOOK seconds and every LOOK_AGAIN seconds after, and a
case found anywhere but importing or compiling has timed out then (an implementation that hangs from its first
case is told in seconds, not a minute). After that a
case gets MULTIPLE times the larger of its yardstick and the longest any finished case took, and never less
than FLOOR: a long case is not cut (it is slow like its peers) while a stuck one ends in seconds, from the first
timeout on. A case larger than every finished one gets the largest finished case's time scaled up to its
number of elements (scaling from the largest only: small cases' times are mostly fixed overhead), that scaling
capped at DEFAULT_TIMEOUT. "Finished" means it returned outputs (right or wrong), timed from the moment its
world was ready: start-up and restarts after a failure are not part of a case's own time (they are part of its
row's). When STUCK_AFTER cases have timed out and none has finished, the implementation is stuck: `stuck` says
so, and a run stops there rather than spend a limit on every case.
"""
from __future__ import annotations

from contextlib import contextmanager

from math import prod
from time import perf_counter
from typing import Callable, TypeVar

from ..core.errors import CaseTimeout, UsageError
from ..engine.compare import reference_seconds

DEFAULT_TIMEOUT = 60.0  # seconds: the first case, and a world's fixed limit when given none
FIRST_LOOK = 10.0   # seconds: when the first case, still running, is looked at (is it importing or compiling?)
LOOK_AGAIN = 2.0    # seconds: and how often after that, while it is
MULTIPLE = 20.0     # generous: a correct case varies by far less than this between cases of one sweep
FLOOR = 1.5         # seconds: well above a stalled scheduler's hiccup, well below a person's patience
# Timeouts with no case finished before a run calls the implementation stuck: enough that a hang on one value
# of one factor (the sweep mixes every factor's values from its first cases on) never looks like a hang on all. Counted
# per rank: timeouts of cases that have rank r, while no case that has rank r finished (a rank that always hangs stops
# the run though the one-rank cases finish; a hang at one world size does not, as its neighbours' sizes finish)
STUCK_AFTER = 10

T = TypeVar("T")


def positive_seconds(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number of seconds, got {value!r}") from None
    if not value > 0:
        raise UsageError(f"{name} must be > 0 seconds, got {value:g}")
    return value


class CaseLimit:
    """The time limit of every case of one run: `fixed` seconds, or adaptive (fixed=None)."""

    def __init__(self, fixed: float | None = None, name: str = "timeout",
                 yardstick: Callable[[object], float] = reference_seconds):
        self.fixed = None if fixed is None else positive_seconds(fixed, name)
        self.name = name
        self.yardstick = yardstick  # seconds a case takes that need nothing of the implementation
        # All the estimate needs of the finished cases: the longest time, and (elements, seconds) of
        # the largest case (the slower one among equals); None before any case finished.
        self.longest = 0.0
        self._largest: tuple[int, float] | None = None
        self.finished = 0
        self.timed_out = 0
        self._timed_out_with: dict[int, int] = {}  # rank -> timeouts of cases that have that rank
        self._finished_with: set[int] = set()      # the ranks some finished case had
        self._expected: tuple[object, float] | None = None  # (case, seconds): expect()'s

    @contextmanager
    def aside(self):
        """Cases run inside leave the run's measurements as they were: a run's probes of what an implementation takes
        (impls.limits) say nothing of how long its cases take, and a hung probe is not one of its cases."""
        saved = (self.longest, self._largest, self.finished, self.timed_out, dict(self._timed_out_with),
                 set(self._finished_with), self._expected)
        try:
            yield
        finally:
            (self.longest, self._largest, self.finished, self.timed_out, self._timed_out_with, self._finished_with,
             self._expected) = saved

    def expect(self, case, seconds: float) -> None:
        """Take `seconds` as `case`'s yardstick instead of measuring it: a case derived from a judged one, whose own
        reference is never computed (the batch-invariance check's batches, timed from their case's)."""
        self._expected = (case, seconds)

    def seconds(self, case) -> float:
        if self.fixed is not None:
            return self.fixed
        seconds, _ = self._estimate(case)
        if self._starting:
            return max(DEFAULT_TIMEOUT, MULTIPLE * seconds)
        return max(FLOOR, MULTIPLE * seconds)

    def first_look(self, case) -> float | None:
        """When to look whether `case`, still running, is starting up (importing, compiling) rather than stuck: the
        first case's FIRST_LOOK, below its allowance; None for every other case and under a fixed limit."""
        if self.fixed is not None or not self._starting or self.seconds(case) <= FIRST_LOOK:
            return None
        return FIRST_LOOK

    def rule(self, case) -> str:
        """Why `case` has the limit it has, in words ('' for a fixed one: its number says it all)."""
        if self.fixed is not None:
            return ""
        seconds, what = self._estimate(case)
        if self._starting and MULTIPLE * seconds <= DEFAULT_TIMEOUT:
            return (f"limit {DEFAULT_TIMEOUT:g} s for the first case while it imports or compiles, {FIRST_LOOK:g} s "
                    "otherwise; --timeout S sets one")
        return f"limit {self.seconds(case):.3g} s: {MULTIPLE:g} × {what} ({seconds:.2g} s), at least {FLOOR:g} s; " \
               "--timeout S sets one"

    @property
    def stuck(self) -> str:
        """Why a run should stop here: under an adaptive limit, STUCK_AFTER cases that have some rank timed out and
        none that has it finished (a single process: its rank 0; '' while that is not so)."""
        if self.fixed is not None:
            return ""
        rank = next((r for r, n in sorted(self._timed_out_with.items())
                     if n >= STUCK_AFTER and r not in self._finished_with), None)
        if rank is None:
            return ""
        never = "none finished" if not self.finished else f"none with a rank {rank} finished"
        which = "" if rank == 0 else f" with a rank {rank}"
        return (f"stopped: {self._timed_out_with[rank]} cases{which} timed out and {never}, so the implementation "
                "looks stuck (--timeout S gives every case S seconds and never stops early)")

    def describe(self) -> dict:
        """The rule as data (the JSON report's time_limit)."""
        if self.fixed is not None:
            return {"rule": "fixed", "seconds": self.fixed}
        return {"rule": "adaptive", "first_case_seconds": DEFAULT_TIMEOUT, "first_look_seconds": FIRST_LOOK,
                "multiple": MULTIPLE, "floor_seconds": FLOOR,
                "yardstick": "the float64 reference's time on the case", "stuck_after": STUCK_AFTER}

    def run(self, case, work: Callable[[float], T]) -> T:
        """work(timeout) under the case's limit. A return is a measurement; a CaseTimeout says which
        limit applied."""
        timeout, rule = self.seconds(case), self.rule(case)
        start = perf_counter()
        try:
            result = work(timeout)
        except CaseTimeout as e:
            if self.fixed is not None:  # a limit too short for any implementation: the run's setting, not a verdict
                short = self._too_short(case, e)
                if short:
                    raise UsageError(f"{self.name} {self.fixed:g} s is too short to judge a case: {short}; give more "
                                     "seconds") from None
            self.timed_out += 1
            for r in _ranks(case):
                self._timed_out_with[r] = self._timed_out_with.get(r, 0) + 1
            if rule:
                raise CaseTimeout(f"{e} ({rule})", e.seconds) from None
            raise
        seconds = perf_counter() - start
        self.longest = max(self.longest, seconds)
        self._largest = max(self._largest or (0, 0.0), (_elements(case), seconds))
        self.finished += 1
        self._finished_with.update(_ranks(case))
        return result

    def _too_short(self, case, e: CaseTimeout) -> str | None:
        """Why the fixed limit, not the implementation, ended `case`: it ran out before the implementation began,
        or within the time normcheck's own float64 reference takes on the case (no hang told from the work)."""
        if e.unstarted:
            return f"it ran out while {e.unstarted}"
        own = self.yardstick(case)
        if self.fixed < own:
            return f"the float64 reference alone takes {own:.2g} s on {case.label}"
        return None

    @property
    def _starting(self) -> bool:
        """Nothing has finished or timed out yet: the next case carries the implementation's start-up."""
        return not self.finished and not self.timed_out

    def _estimate(self, case) -> tuple[float, str]:
        """(seconds `case` should take, what says so, in words)."""
        if self._expected is not None and self._expected[0] == case:
            estimates = [(self._expected[1], "the float64 reference's time on the case it derives from, scaled")]
        else:
            estimates = [(self.yardstick(case), "the float64 reference's time on this case")]
        if self._largest is not None:
            largest, its_time = self._largest
            n = _elements(case)
            estimates.append((self.longest, "the longest finished case"))
            if n > largest:
                estimates.append((min(its_time * n / largest, DEFAULT_TIMEOUT / MULTIPLE),
                                  "the largest finished case scaled up to this one's size"))
        return max(estimates, key=lambda e: e[0])

    def __repr__(self) -> str:
        return f"CaseLimit({self.fixed:g})" if self.fixed is not None else f"CaseLimit(adaptive, {self.finished} finished)"


def as_limit(timeout: "CaseLimit | float | None") -> CaseLimit:
    """A CaseLimit from what callers pass: a limit (kept: it carries the run's measurements), seconds
    (fixed), or None (adaptive)."""
    return timeout if isinstance(timeout, CaseLimit) else CaseLimit(timeout)


def _ranks(case) -> range:
    """The ranks a case has: its split's (a distributed op's), else the one process's rank 0."""
    split = getattr(case, "split", None)
    return range(len(split) if split else 1)


def _elements(case) -> int:
    return max(1, prod(case.shape))
