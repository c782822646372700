"""Shared pytest setup: hypothesis profiles (DESIGN.md: ci, dev, thorough; normcheck/hypothesis_settings.py).

`ci` is the default: derandomized with a fixed budget, so the gate is reproducible. Choose another
with `pytest --hypothesis-profile=dev` (random, more examples) or `thorough` (many more).
"""
import os

from hypothesis import settings

from normcheck.cases.budgets import register_profiles

register_profiles()
settings.load_profile(os.environ.get("NORMCHECK_HYPOTHESIS_PROFILE", "ci"))

# The gate's files in the order its two workers should start them (pytest-xdist's loadfile hands files out in
# collection order): the one that mostly waits (a hanging implementation's time limits) first, so that the other
# worker fills the wait, then the longest, so that the last minutes are short files on both workers rather than one
# long file on one of them (longest first: the usual greedy schedule).
FIRST = ("tests/test_stuck.py", "tests/test_ops.py", "tests/test_impls.py", "tests/test_frameworks.py",
         "tests/test_conventions.py", "tests/test_readme.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)
    items.sort(key=rank)  # (stable: the rest keep their order)
