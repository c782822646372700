"""Shared pytest setup: hypothesis profiles (DESIGN.md: ci, dev, thorough).

`ci` is the default: derandomized with a fixed budget, so the gate is reproducible. Choose another
with `pytest --hypothesis-profile=dev` (random, more examples) or `thorough` (many more).
"""
import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", derandomize=True, max_examples=40, database=None, print_blob=True, **_COMMON)
settings.register_profile("dev", max_examples=150, print_blob=True, **_COMMON)
settings.register_profile("thorough", max_examples=2000, print_blob=True, **_COMMON)
settings.load_profile(os.environ.get("NORMCHECK_HYPOTHESIS_PROFILE", "ci"))
