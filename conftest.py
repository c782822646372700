"""Shared pytest setup: hypothesis profiles (ci, dev, thorough: normcheck/cases/budgets.py).

`ci` is the default: derandomized with a fixed budget, so the gate is reproducible. Choose another
with `pytest --hypothesis-profile=dev` (random, more examples) or `thorough` (many more).
"""
import os

import pytest

# Two gate workers (pytest -n 2) share two cores with the isolated worker processes they start: OpenMP's passive waits
# and one OpenBLAS thread (normcheck.core.forkserver.QUIET_THREADS: the same tests took 49 s side by side against 20 s
# alone, 26 s with passive waits; four ops' template sweeps in two processes 57-63 s -> 48 s with one BLAS thread).
# Set before anything loads torch or NumPy, here and in every process started from here.
from normcheck.core.forkserver import quiet_threads  # noqa: E402  (a leaf: imports neither torch nor NumPy)

quiet_threads()

from hypothesis import settings  # noqa: E402

from normcheck.cases.budgets import register_profiles  # noqa: E402

register_profiles()
settings.load_profile(os.environ.get("NORMCHECK_HYPOTHESIS_PROFILE", "ci"))

# The gate's files in the order its two workers should start them (pytest-xdist's loadfile hands files out in
# collection order once its own reordering, by number of tests, is off: pytest_configure): the one that mostly waits
# (a hanging implementation's time limits) first, so that the other worker fills the wait, then the longer ones,
# longest first (the usual greedy schedule), so that the last minutes are short files on both workers rather than
# one long file on one of them. xdist's own order put the one-test files last: the 30 s wait ran at the end.
FIRST = ("tests/test_stuck.py", "tests/test_impls.py", "tests/test_frameworks.py", "tests/test_conventions.py",
         "tests/test_ops.py", "tests/test_pytest_plugin.py", "tests/test_readme.py", "tests/test_isolation.py",
         "tests/test_interrupts.py", "tests/test_narrowing.py", "tests/test_parallel.py", "tests/test_worlds_gloo.py",
         "tests/test_properties.py", "tests/test_cli.py", "tests/test_worlds.py", "tests/test_syncbn_cli.py",
         "tests/test_progress.py", "tests/test_layernorm_gate.py", "tests/test_layer_classes.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # (pytest-xdist: sorts files by their number of tests)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)
    items.sort(key=rank)  # (stable: the rest keep their order)


# How many tests the gate has, for README's test (tests/test_readme.py): known only in a session that collected the
# whole gate (`pytest`, README's command: the testpaths, nothing deselected), where each xdist worker collects it all.
# A count taken here never needs writing down by hand; `pytest --collect-only -q` in a process of its own costs 10-20 s.
_gate = {"deselected": 0, "collected": None}


def pytest_deselected(items):
    _gate["deselected"] += len(items)


def pytest_collection_finish(session):
    config = session.config
    whole = (config.args_source == config.ArgsSource.TESTPATHS and not _gate["deselected"]
             and not config.getoption("keyword", "") and not config.getoption("markexpr", ""))
    _gate["collected"] = len(session.items) if whole else None


@pytest.fixture
def gate_collected():
    """The number of tests the gate collected in this session, or None in a run of some of its files."""
    return _gate["collected"]
