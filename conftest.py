"""Shared pytest setup: hypothesis profiles (DESIGN.md: ci, dev, thorough; normcheck/hypothesis_settings.py).

`ci` is the default: derandomized with a fixed budget, so the gate is reproducible. Choose another
with `pytest --hypothesis-profile=dev` (random, more examples) or `thorough` (many more).
"""
import os

from hypothesis import settings

from normcheck.cases.budgets import register_profiles

register_profiles()
settings.load_profile(os.environ.get("NORMCHECK_HYPOTHESIS_PROFILE", "ci"))
