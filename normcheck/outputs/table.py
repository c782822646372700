"""The table: one row per case, then one summary line."""
from __future__ import annotations

from ..engine import Report, tally


def row(r: Report) -> str:
    worst = r.worst
    ratio = f"{worst.max_ratio:9.3g}" if worst else " " * 9
    return f"{r.verdict:<10} {ratio}  {r.case.label:<52} {r.summary()}"


def summary_line(op: str, impl: str, reports: list[Report], seconds: float) -> str:
    return f"{op} / {impl}: {len(reports)} cases: {tally(reports)} in {seconds:.1f} s"
