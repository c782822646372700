"""normcheck's budgeted search for one implementation, run by `pytest --normcheck-op OP --normcheck-budget 5m ...`
instead of the default sweep and the generated cases (normcheck.pytest_plugin collects one or the other).

One test: fresh cases (normcheck.cases.search_space) judged for the budget (normcheck.engine.search); a failing case
is shrunk to the smallest that fails, and the test fails with it: the case, what went wrong, its replay line, how far
it was shrunk, where its errors sit, and the search's seed.
"""
import pytest

from normcheck.cases.search_space import search_cases
from normcheck.engine.search import database_folder, search
from normcheck.outputs.table import search_details, search_summary_line
from normcheck.pytest_plugin import failure_message
from normcheck.worlds import printed


def test_budgeted_search(normcheck_options):
    o = normcheck_options
    if o.interrupted:  # (a signal while the implementation was probed: the run stops here, reporting)
        raise KeyboardInterrupt
    run = search(o.bound, search_cases(o.record, o.narrowing, o.bound.impl.formats, o.bound.impl.shares), o.budget,
                 seed=o.seed, database=database_folder(o.op, o.bound.name, o.narrowing))
    if run.interrupted:
        raise KeyboardInterrupt
    summary = search_summary_line(o.op, o.bound.name, run)
    if run.found is not None:
        printed.start()  # (what the search's many runs printed belongs to none of them in particular)
        details = "".join(f"\n{line}" for line in search_details(run))
        pytest.fail(f"{failure_message(run.found, o.backend, timeout=o.timeout)}{details}\n{summary}", pytrace=False)
    if not set(run.verdicts) - {"SKIP"}:
        pytest.fail(f"nothing was tested: every case the search drew was skipped ({summary})", pytrace=False)
