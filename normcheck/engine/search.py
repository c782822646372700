"""A time-budgeted search: judge fresh cases (cases.search_space) until the budget is spent, shrink a failure.

hypothesis runs the search: its generation draws the cases, its shrinker takes a failing case to the smallest that
still fails (size by size, factor by factor), and its example database replays last run's failure first. A FAIL
(with `strict`, a KNOWN too) raises inside the property, so hypothesis shrinks it; PASS, KNOWN, SKIP and MISTRUSTED
do not. hypothesis runs until it is stopped: the search stops it when the budget is spent, and stops its shrinking
after `shrink` seconds more, keeping the smallest failing case it has judged. `seed` fixes the run's draws (None: a
fresh one, reported, so that the run can be repeated).
"""
from __future__ import annotations

import random
import re
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..core.disk_cache import cache_root, digest
from ..core.errors import UsageError
from ..ops import Bound
from .compare import case_inputs, judge
from .locate import error_sites
from .report import FAIL, KNOWN, Report

MAX_EXAMPLES = 10**7  # never reached: the budget stops a search
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}


def budget_seconds(text: str) -> float:
    """'300', '300s', '5m', '1.5h' -> seconds; UsageError (one line) for anything else."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", text.lower())
    if found is None or float(found.group(1)) <= 0:
        raise UsageError(f"--budget {text!r} is not a duration: give seconds (300 or 300s), minutes (5m) or hours (1h)")
    return float(found.group(1)) * _UNITS[found.group(2)]


def require_hypothesis(option: str = "--budget") -> None:
    """Called before a search starts, so a missing dependency costs one line."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise UsageError(f'{option} searches with hypothesis, which is not installed: pip install "normcheck[pytest]"') \
            from None


@dataclass
class Search:
    """What a search did: the cases it judged (by verdict), when, and the smallest failing case's report (None: none
    failed), with where its errors sit (engine.locate) and whether its shrinking ran to the end."""
    seed: int
    budget: float
    verdicts: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    first_failure: float | None = None   # seconds from the start to the first failing case
    shrink_seconds: float = 0.0
    shrink_cases: int = 0
    shrunk: bool = True                  # False: the shrink's time ran out first
    found: Report | None = None
    first_found: Report | None = None    # the failing case as first drawn
    sites: list[str] = field(default_factory=list)
    note: str = ""                       # what hypothesis said beside the verdicts (a failure that did not repeat)
    interrupted: bool = False            # Ctrl-C (or SIGTERM, as the CLI takes it) ended it: what it found is kept

    @property
    def judged(self) -> int:
        """The cases drawn and judged until the first failure (that one included), or in the whole budget."""
        return sum(self.verdicts.values())

    @property
    def searched(self) -> float:
        """The seconds those cases took."""
        return self.seconds if self.first_failure is None else self.first_failure


class _Failed(Exception):
    """A failing case, raised inside the property so that hypothesis shrinks it."""

    def __init__(self, report: Report):
        super().__init__(report.summary())
        self.report = report


class _TimeUp(BaseException):
    """The budget (or the shrink's time) is spent: hypothesis lets a BaseException through, ending its run."""


def search(bound: Bound, strategy, budget: float, shrink: float | None = None, seed: int | None = None,
           database: Path | None = None, strict: bool = False, on_report=None, home: Path | None = None) -> Search:
    """Judge the `bound` implementation on cases of `strategy` (cases.search_space.search_cases) for `budget` seconds;
    shrink a failing case for at most `shrink` seconds more (None: the budget again). `database`: hypothesis's example
    database's folder (None: none kept); `on_report(report)`: called after each judged case (progress); `home`: where
    hypothesis keeps its other files meanwhile (None: where it would, .hypothesis/ in the working directory)."""
    with _hypothesis_home(home):
        return _search(bound, strategy, budget, shrink, seed, database, strict, on_report)


@contextmanager
def _hypothesis_home(home: Path | None):
    """hypothesis's files (its cache of the constants it reads in the caller's code) under `home` for a while: a
    command leaves nothing in the directory it runs in."""
    if home is None:
        yield
        return
    from hypothesis.configuration import set_hypothesis_home_dir, storage_directory

    before = storage_directory(intent_to_write=False).home_directory
    set_hypothesis_home_dir(home)
    try:
        yield
    finally:
        set_hypothesis_home_dir(before)


def _search(bound: Bound, strategy, budget: float, shrink: float | None, seed: int | None, database: Path | None,
            strict: bool, on_report) -> Search:
    from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
    from hypothesis import seed as with_seed
    from hypothesis.errors import Flaky, Unsatisfiable

    run = Search(seed=random.randrange(2**32) if seed is None else seed, budget=budget)
    quiet = replace(bound, hints=None)  # (a hint is searched for the case the search ends with, not for every one)
    failing = (FAIL, KNOWN) if strict else (FAIL,)
    start = time.perf_counter()
    clock = {"stop": start + budget, "stopped": False}

    def spent() -> bool:
        if time.perf_counter() > clock["stop"]:
            clock["stopped"] = True  # (the database keeps nothing of the case that was cut off)
        return clock["stopped"]

    @settings(database=_database(database, lambda: clock["stopped"]), deadline=None, max_examples=MAX_EXAMPLES,
              derandomize=False, phases=(Phase.reuse, Phase.generate, Phase.shrink),
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False,
              verbosity=Verbosity.quiet)
    @with_seed(run.seed)
    @given(strategy)
    def property_(case):
        if spent():
            raise _TimeUp
        try:
            report = judge(case, quiet)
        except UsageError:  # (a case it judges bad input, too large for this machine: never a finding)
            reject()
        if run.first_failure is None:
            run.verdicts[report.verdict] += 1
        else:
            run.shrink_cases += 1
        if on_report is not None:
            on_report(report)
        if report.verdict in failing:
            _keep(run, report, start, clock, shrink if shrink is not None else budget)
            raise _Failed(report)

    try:
        property_()
    except _Failed as e:  # (hypothesis's own last word: the shrunk case, judged again)
        run.found = e.report
    except _TimeUp:
        run.shrunk = run.found is None
    except KeyboardInterrupt:
        run.interrupted, run.shrunk = True, run.found is None
    except Flaky as e:
        run.note = f"a failing case did not fail again: {str(e).splitlines()[0]}"
    except Unsatisfiable:
        raise UsageError("the search drew no case the run's options and the implementation's limits admit") from None
    run.seconds = time.perf_counter() - start
    if run.first_failure is not None:
        run.shrink_seconds = run.seconds - run.first_failure
    if run.found is not None:
        run.found, run.sites = _final(run.found, bound, failing)
    return run


def database_folder(op: str, impl: str, narrowing) -> Path:
    """Where hypothesis keeps the failing cases of searches of `impl` on `op` under `narrowing` (the disk cache's
    search/ folder): a failure found last night is drawn first tonight."""
    return cache_root() / "search" / digest([op, impl, repr(narrowing)])[:16]


def _keep(run: Search, report: Report, start: float, clock: dict, shrink: float) -> None:
    """Keep the smallest failing case judged so far; the first one starts the shrink's clock."""
    if run.first_failure is None:
        run.first_failure = time.perf_counter() - start
        run.first_found = report
        clock["stop"] = time.perf_counter() + shrink
    if run.found is None or report.case.numel <= run.found.case.numel:
        run.found = report


def _final(report: Report, bound: Bound, failing) -> tuple[Report, list[str]]:
    """The smallest failing case's report, judged again with the run's hint search (where it fails again), and where
    its errors sit."""
    again = judge(report.case, bound) if bound.hints is not None else report
    return (again if again.verdict in failing else report), _sites(report, bound)


def _sites(report: Report, bound: Bound) -> list[str]:
    """Where the failing case's errors sit: its outputs again (a report keeps none), over their allowance."""
    if not any(t.verdict == FAIL for t in report.tensors):
        return []  # (it raised, or differed between two runs: no tensor to read)
    case = report.judged_case
    try:
        outputs = bound.runner(case, case_inputs(case))[0]
    except Exception:  # noqa: BLE001 - it failed by its values once; a second run that raises says nothing of where
        return []
    return error_sites(case, outputs)


def _database(folder: Path | None, stopped):
    """hypothesis's example database in `folder`, keeping nothing once the search is stopped (hypothesis saves the
    case the stop cut off, which did not fail)."""
    if folder is None:
        return None
    from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

    class UntilStopped(ExampleDatabase):
        def __init__(self, db):
            super().__init__()
            self.db = db

        def save(self, key, value):
            if not stopped():
                self.db.save(key, value)

        def fetch(self, key):
            return self.db.fetch(key)

        def delete(self, key, value):
            self.db.delete(key, value)

        def move(self, src, dest, value):
            self.db.move(src, dest, value)

    return UntilStopped(DirectoryBasedExampleDatabase(folder))
