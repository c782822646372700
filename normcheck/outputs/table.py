"""The table: one row per case, then one summary line; verdicts in colour on a terminal."""
from __future__ import annotations

import os
from typing import TextIO

from ..engine import FAIL, KNOWN, MISTRUSTED, PASS, Report, tally, tested_count
from ..engine.report import never_checked

_COLOURS = {PASS: "32", FAIL: "31", KNOWN: "33", MISTRUSTED: "33"}  # green, red, yellow (ANSI)


def wants_colour(stream: TextIO) -> bool:
    """Colour for a person at a terminal: not with NO_COLOR set (no-color.org), not in CI."""
    in_ci = os.environ.get("CI", "").lower() not in ("", "0", "false")
    return stream.isatty() and "NO_COLOR" not in os.environ and not in_ci


def row(r: Report, colour: bool = False, seed: bool = False) -> str:
    """verdict, worst ratio, the case (with its seed when a run repeats cases), what went wrong."""
    worst = r.worst
    ratio = f"{worst.max_ratio:9.3g}" if worst else " " * 9
    verdict = f"{r.verdict:<10}"
    if colour and r.verdict in _COLOURS:
        verdict = f"\033[{_COLOURS[r.verdict]}m{r.verdict}\033[0m" + " " * (10 - len(r.verdict))
    label = f"{r.case.label} seed={r.case.seed}" if seed else r.case.label
    return f"{verdict} {ratio}  {label:<52} {r.summary()}"


def hint_line(r: Report) -> str | None:
    """The line under a failing row (after its replay line) that says under which declared conventions it passes
    (engine.hints); None when it has no hint."""
    return None if r.hint is None else f"    hint: {r.hint}"


def summary_line(op: str, impl: str, reports: list[Report], seconds: float) -> str:
    """'... 108 cases: 54 passed, 0 failed, 54 skipped in 4.1 s (54 of 108 cases tested)'."""
    tested = tested_count(reports)
    coverage = f" ({tested} of {len(reports)} cases tested)" if tested < len(reports) else ""
    blind = never_checked(reports)
    unchecked = (f"; never checked: {', '.join(blind)} (a budget as large as the tensor itself wherever compared)"
                 if blind else "")
    return f"{op} / {impl}: {len(reports)} cases: {tally(reports)} in {seconds:.1f} s{coverage}{unchecked}"
