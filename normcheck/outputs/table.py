"""The table: one row per case, then one summary line; verdicts in colour on a terminal."""
from __future__ import annotations

import os
from typing import TextIO

from ..ops import Op
from ..engine import FAIL, KNOWN, MISTRUSTED, PASS, Report, tally, tested_count
from ..cases.narrowing import Narrowing
from ..cases.sweep import factors, limit_fields, narrowed_away
from ..engine.coverage import JudgedCoverage
from ..engine.report import never_checked, tally_of
from ..engine.search import Search

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


def late_hint_lines(late: list[Report]) -> list[str]:
    """One line per hint that rows printed above carry only since a later row of their kind was explained
    (engine.compare.hint_again): how many, which (the first three), and the hint."""
    by_hint = {}
    for r in late:
        by_hint.setdefault(str(r.hint), []).append(r)
    lines = []
    for hint, rows in by_hint.items():
        named = "; ".join(r.case.label for r in rows[:3]) + (f"; and {len(rows) - 3} more" if len(rows) > 3 else "")
        lines.append(f"hint, for {len(rows)} FAIL row{'s' if len(rows) > 1 else ''} above judged before a row of their "
                     f"kind was explained ({named}): {hint}")
    return lines


def summary_line(op: str, impl: str, reports: list[Report], seconds: float, covered: JudgedCoverage | None = None) -> str:
    """'... 108 cases: 54 passed, 0 failed, 54 skipped in 4.1 s (54 of 108 cases tested); 1790 of 1857 pairs judged
    (...)': with a sweep's coverage as judged (engine.coverage), what no judged case covered, the first of it named."""
    tested = tested_count(reports)
    coverage = f" ({tested} of {len(reports)} cases tested)" if tested < len(reports) else ""
    blind = never_checked(reports)
    unchecked = (f"; never checked: {', '.join(blind)} (a budget as large as the tensor itself wherever compared)"
                 if blind else "")
    pairs = ""
    if covered is not None:
        never = (f" (never judged: {covered.never[0]}" + (f"; and {len(covered.never) - 1} more" if len(covered.never) > 1
                                                          else "") + ")") if covered.never else ""
        pairs = f"; {covered.text()}{never}"
    return f"{op} / {impl}: {len(reports)} cases: {tally(reports)} in {seconds:.1f} s{coverage}{pairs}{unchecked}"


def search_lines(run: Search, replay: str, colour: bool = False) -> list[str]:
    """A search's smallest failing case: its row, replay line and hint (as a sweep prints a failing row), how far it
    was shrunk, and where its errors sit (engine.locate)."""
    found = run.found
    lines = [row(found, colour), f"    replay: {replay}"]
    if found.hint is not None:
        lines.append(hint_line(found))
    return lines + [f"    {line}" for line in search_details(run)]


def search_details(run: Search) -> list[str]:
    """'shrunk to 88 elements (1x88) from 45056 (1x1x2x22528 ...) in 6.4 s, 50 cases', then a line per output whose
    elements are over budget, where they sit."""
    found, first = run.found, run.first_found or run.found
    cut = "" if run.shrunk else "; the shrink's time ran out: the smallest failing case judged"
    shrunk = (f"shrunk to {found.case.numel} elements ({_shape(found)}) from {first.case.numel} ({first.case.label}) in "
              f"{run.shrink_seconds:.1f} s, {run.shrink_cases} cases{cut}")
    return [shrunk, *run.sites] + ([run.note] if run.note else [])


def _shape(r: Report) -> str:
    return "x".join(map(str, r.case.shape))


def search_summary_line(op: str, impl: str, run: Search) -> str:
    """'layernorm / torch: searched 812 cases in 300.0 s (--seed 7): 700 passed, 0 failed, ...', or until the first
    failure: '... searched 14 cases in 1.8 s (--seed 7): 9 passed, 1 failed, 4 mistrusted, then shrank it in 6.4 s'."""
    shrink = "" if run.found is None else f", then shrank it in {run.shrink_seconds:.1f} s"
    return (f"{op} / {impl}: searched {run.judged} cases in {run.searched:.1f} s (--seed {run.seed}): "
            f"{tally_of(run.verdicts)}{shrink}")


def narrowed_lines(op: Op, narrowing: Narrowing) -> list[str]:
    """One line per factor whose levels the implementation's limits took away from the design the run asked for
    (cases.sweep.narrowed_away), with why: 'narrowed: order 1 and fwd only (not 2, fwd-rev: ...)'."""
    show = {f.name: f.show for f in factors(op)}
    lines = [f"narrowed: {name} {value} only: {why}" for name, (value, why) in limit_fields(op, narrowing).items()]
    for name, kept, gone in narrowed_away(op, narrowing):
        by_why = {}
        for v, why in gone.items():
            by_why.setdefault(why, []).append(show[name](v))
        whys = "; ".join(f"not {(' | ' if any(',' in v for v in values) else ', ').join(values)}: {why}"
                         for why, values in by_why.items())
        shown = [show[name](v) for v in kept]
        lines.append(f"narrowed: {name} {(' | ' if any(',' in v for v in shown) else ', ').join(shown)} only ({whys})"
                     if len(kept) <= 3 else f"narrowed: {name} ({whys})")
    return lines
