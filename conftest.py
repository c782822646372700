"""Shared pytest setup: hypothesis profiles (DESIGN.md: ci, dev, thorough; normcheck/hypothesis_settings.py).

`ci` is the default: derandomized with a fixed budget, so the gate is reproducible. Choose another
with `pytest --hypothesis-profile=dev` (random, more examples) or `thorough` (many more).
"""
import os

from hypothesis import settings

from normcheck.cases.budgets import register_profiles

register_profiles()
settings.load_profile(os.environ.get("NORMCHECK_HYPOTHESIS_PROFILE", "ci"))

# Files whose tests mostly wait (a hanging implementation's time limits): collected first, so that the gate's other
# worker fills the wait (pytest-xdist's loadfile hands files out in collection order) instead of the last minute
# of the gate idling on it.
WAITING_FIRST = ("tests/test_stuck.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith(WAITING_FIRST))  # (stable: the rest keep their order)
