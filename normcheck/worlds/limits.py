"""How long one case may run: an explicit --timeout, or a limit that follows what the run measured.

Until a case has finished nothing is known about the implementation, so the first case gets
DEFAULT_TIMEOUT seconds (also what a world uses when nobody gives it a limit). After that a case gets
MULTIPLE times the longest any finished case took, and never less than FLOOR: a long case is not cut
(it is slow like its peers) while a stuck one ends in seconds. A case larger than every finished one
gets the largest finished case's time scaled up to its number of elements (scaling from the largest
only: small cases' times are mostly fixed overhead), that scaling capped at DEFAULT_TIMEOUT. "Finished" means it returned
outputs (right or wrong), timed from the moment its world was ready: start-up and restarts after a
failure are not part of a case's own time (they are part of its row's).
"""
from __future__ import annotations

from math import prod
from time import perf_counter
from typing import Callable, TypeVar

from ..core.errors import CaseTimeout, UsageError

DEFAULT_TIMEOUT = 60.0  # seconds: before any case finished, and a world's fixed limit when given none
MULTIPLE = 20.0     # generous: a correct case varies by far less than this between cases of one sweep
FLOOR = 1.5         # seconds: well above a stalled scheduler's hiccup, well below a person's patience

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

    def __init__(self, fixed: float | None = None, name: str = "timeout"):
        self.fixed = None if fixed is None else positive_seconds(fixed, name)
        # All the estimate needs of the finished cases: the longest time, and (elements, seconds) of
        # the largest case (the slower one among equals); None before any case finished.
        self._longest = 0.0
        self._largest: tuple[int, float] | None = None
        self.finished = 0

    def seconds(self, case) -> float:
        if self.fixed is not None:
            return self.fixed
        estimate = self._estimate(case)
        return DEFAULT_TIMEOUT if estimate is None else max(FLOOR, MULTIPLE * estimate[0])

    def rule(self, case) -> str:
        """Why `case` has the limit it has, in words ('' for a fixed one: its number says it all)."""
        if self.fixed is not None:
            return ""
        estimate = self._estimate(case)
        if estimate is None:
            return f"limit {DEFAULT_TIMEOUT:g} s until a case has finished; --timeout S sets one"
        seconds, scaled = estimate
        what = "the largest finished case scaled up to this one's size" if scaled else "the longest finished case"
        return f"limit {self.seconds(case):.3g} s: {MULTIPLE:g} × {what} ({seconds:.2g} s), at least {FLOOR:g} s; " \
               "--timeout S sets one"

    def describe(self) -> dict:
        """The rule as data (the JSON report's time_limit)."""
        if self.fixed is not None:
            return {"rule": "fixed", "seconds": self.fixed}
        return {"rule": "adaptive", "first_case_seconds": DEFAULT_TIMEOUT, "multiple": MULTIPLE, "floor_seconds": FLOOR}

    def run(self, case, work: Callable[[float], T]) -> T:
        """work(timeout) under the case's limit. A return is a measurement; a CaseTimeout says which
        limit applied."""
        timeout = self.seconds(case)
        start = perf_counter()
        try:
            result = work(timeout)
        except CaseTimeout as e:
            rule = self.rule(case)
            if rule:
                raise CaseTimeout(f"{e} ({rule})") from None
            raise
        seconds = perf_counter() - start
        self._longest = max(self._longest, seconds)
        self._largest = max(self._largest or (0, 0.0), (_elements(case), seconds))
        self.finished += 1
        return result

    def _estimate(self, case) -> tuple[float, bool] | None:
        """(seconds `case` should take, whether that is scaled up from a smaller case); None before
        any case finished."""
        if self._largest is None:
            return None
        largest, its_time = self._largest
        n = _elements(case)
        if n <= largest:
            return self._longest, False
        scaled = min(its_time * n / largest, DEFAULT_TIMEOUT / MULTIPLE)
        return (scaled, True) if scaled > self._longest else (self._longest, False)

    def __repr__(self) -> str:
        return f"CaseLimit({self.fixed:g})" if self.fixed is not None else f"CaseLimit(adaptive, {self.finished} finished)"


def as_limit(timeout: "CaseLimit | float | None") -> CaseLimit:
    """A CaseLimit from what callers pass: a limit (kept: it carries the run's measurements), seconds
    (fixed), or None (adaptive)."""
    return timeout if isinstance(timeout, CaseLimit) else CaseLimit(timeout)


def _elements(case) -> int:
    return max(1, prod(case.shape))
