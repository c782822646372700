"""Where a sweep's reports go: each row as its case is judged (the table, with a failing row's traceback, replay
line, hint and what the implementation printed), and the run's end (the summary line or --json's document, the JUnit
file, the plot). The run (normcheck.cli) hands it each report and, at the end, what the run came to; it computes
nothing of its own, so the table, the document and the JUnit file always say the same."""
from __future__ import annotations

import json
from dataclasses import dataclass
from textwrap import indent
from typing import TextIO

from ..engine import FAIL, Report
from ..engine.coverage import JudgedCoverage, NarrowingHint
from .json_report import run_document
from .junit import write_junit
from .plot import write_plot
from .progress import Progress, wants_progress
from .replay import report_replay
from .table import hint_line, late_hint_lines, row, summary_line, wants_colour


@dataclass(frozen=True)
class Run:
    """What the reports are of: the op and implementation's names, its world and device (a replay line's), the --impl
    it was given, the per-case timeout and the time limit's description, the sweep's size and whether its cases
    repeat with other seeds."""
    op: str
    impl: str
    backend: str | None
    device: str
    triton_interpret: bool
    spec: str | None
    timeout: float | None
    planned: int
    seeds: bool


@dataclass(frozen=True)
class RunEnd:
    """What the run came to: its exit status, why it stopped early (""), its seconds, the time limit's account, the
    coverage its judged cases kept (None: the cases were named), the option that would make the rows that raised
    pass."""
    status: int
    stopped: str
    seconds: float
    time_limit: dict | None
    covered: JudgedCoverage | None
    hint: NarrowingHint | None


class SweepReporter:
    """The table on `out` as the cases are judged (nothing but --json's document there under --json), and the run's
    files at its end; `reports_to`: the request's Reports (json, junit_xml, plot, traceback)."""

    def __init__(self, out: TextIO, reports_to, run: Run, narrowed: list[str]):
        self.out, self.reports_to, self.run, self.narrowed = out, reports_to, run, narrowed
        self._colour = wants_colour(out)
        self._progress = Progress(run.planned, f"{run.op} / {run.impl}", wants_progress(quiet=reports_to.json))

    def __enter__(self) -> SweepReporter:
        for line in self.narrowed:
            self._table(line)
        return self

    def __exit__(self, *exc) -> None:
        self._progress.close()

    def judged(self, report: Report, printed: list[str]) -> None:
        """A case was judged: its row, and under a failing one its traceback (--traceback), replay line, hint and
        the lines the implementation printed (`printed`)."""
        self._progress.advance()
        self._table(row(report, self._colour, self.run.seeds))
        if report.verdict != FAIL:
            return
        if self.reports_to.traceback and report.traceback:
            self._table(indent(report.traceback.rstrip(), "    | "))
        self._table(f"    replay: {report_replay(report, self.run.backend, self.run.timeout, self.run.spec)}")
        hint = hint_line(report)
        if hint:  # (after the replay line, which scripts read right under the row)
            self._table(hint)
        for line in printed:
            self._table(line)

    def hinted_late(self, late: list[Report]) -> None:
        """Rows printed above that carry a hint only since a later row of their kind was explained."""
        for line in late_hint_lines(late):
            self._table(line)

    def ended(self, reports: list[Report], end: RunEnd) -> None:
        """The summary line (or --json's document), the JUnit file and the plot."""
        run, to = self.run, self.reports_to
        if to.json:
            json.dump(run_document(run.op, run.impl, run.backend, reports, end.seconds, end.status, run.timeout,
                                   end.time_limit, end.stopped, run.device, run.triton_interpret, end.covered,
                                   self.narrowed, end.hint.line() if end.hint else None),
                      self.out, indent=1, allow_nan=False)
            print(file=self.out)
        else:
            print(summary_line(run.op, run.impl, reports, end.seconds, end.covered), file=self.out)
            if end.hint is not None:
                print(f"hint: {end.hint.line()}", file=self.out)
        if to.junit_xml:
            write_junit(to.junit_xml, run.op, run.impl, run.backend, reports, end.seconds, to.strict, run.timeout,
                        end.stopped, run.planned)
        if to.plot:
            write_plot(to.plot, f"{run.op} / {run.impl}", reports)

    def _table(self, line: str) -> None:
        if not self.reports_to.json:  # (--json: the document alone on stdout)
            self._progress.print(line, self.out)

