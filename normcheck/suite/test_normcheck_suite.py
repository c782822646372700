"""normcheck's suite for one implementation, run by `pytest --normcheck-op OP --normcheck-impl ...`.

* every case of the default sweep (normcheck.sweep: every dtype, value profile, reduction size
  and layout; for SyncBN uneven and empty-rank splits) is a test of its own;
* a hypothesis property: no generated case (normcheck.cases.strategies) fails. Budget: --normcheck-profile;
* a run whose whole sweep was skipped fails (a gate that tested nothing is not green).

A failure names the tensor, index and budget ratio and ends with the replay line; a case the
implementation declares it cannot take is skipped with its reason; a recorded upstream issue of
torch's own kernels is an expected failure.
"""
import pytest
from hypothesis import assume, given

from normcheck.cases.budgets import PROFILES
from normcheck.cases.strategies import cases
from normcheck.cases.sweep import admits, default_sweep
from normcheck.engine import FAIL, KNOWN, SKIP, judge
from normcheck.pytest_plugin import OPTIONS, failure_message
from normcheck.worlds import printed

# Generated SyncBN cases stay within the worlds the sweep already started (gloo: one process per
# rank, ~4 s to start a world) and small enough that one example takes well under a second.
_GENERATED = {"gloo": dict(max_world=4, max_numel=4096), "lockstep": dict(max_world=8, max_numel=4096)}


def pytest_generate_tests(metafunc):
    if "sweep_case" in metafunc.fixturenames:
        options = metafunc.config.stash[OPTIONS]
        # in the conventions it follows, narrowed by the fields the run fixes
        sweep = default_sweep(options.record, formats=options.bound.impl.formats, shares=options.bound.impl.shares,
                              narrowing=options.narrowing)
        metafunc.parametrize("sweep_case", sweep, ids=[f"{c.label} seed={c.seed}" for c in sweep])


# How many sweep cases ran, and how many of them were tested rather than skipped (their reports are kept in the run's
# options: the plugin's summary reads its coverage as judged off them).
SWEEP = {"ran": 0, "tested": 0}


def check(options, case, reports: list | None = None):
    """Judge `case`; a FAIL fails the test with its replay line. `reports`: where its report is kept, failing or not."""
    if options.interrupted:  # (a signal while the implementation was probed: the run stops here, reporting)
        raise KeyboardInterrupt
    if options.bound.limit is not None and options.bound.limit.stuck:  # the rest of the sweep would only time out
        pytest.fail(f"not run: {options.bound.limit.stuck}", pytrace=False)
    printed.start()
    report = judge(case, options.bound)
    if reports is not None:
        reports.append(report)
    if report.verdict == FAIL:
        pytest.fail(failure_message(report, options.backend, timeout=options.timeout), pytrace=False)
    return report


def test_default_sweep(normcheck_options, sweep_case):
    report = check(normcheck_options, sweep_case, normcheck_options.reports)
    SWEEP["ran"] += 1
    SWEEP["tested"] += report.verdict != SKIP
    if report.verdict == SKIP:
        pytest.skip(report.summary())
    if report.verdict == KNOWN:
        pytest.xfail(report.summary())


def test_generated_cases(normcheck_options):
    o = normcheck_options

    @PROFILES[o.profile]
    @given(cases(o.op, **_GENERATED.get(o.backend, {})))
    def property_(case):
        case = o.narrowing.apply(case)
        assume(case is not None and admits(o.record, case, o.narrowing))  # (a generated case the run's fields do not fit,
        # or with a level the implementation does not take)
        check(o, case)

    property_()


def test_something_was_tested(normcheck_options):
    """A gate that tested nothing is not green: every case of the sweep skipped is a failure."""
    if not SWEEP["ran"]:
        pytest.skip("the default sweep did not run (deselected)")
    if not SWEEP["tested"]:
        pytest.fail(f"nothing was tested: all {SWEEP['ran']} cases of the default sweep were skipped by "
                    f"{normcheck_options.bound.name}", pytrace=False)
