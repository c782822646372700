"""Hypothesis profiles: `ci` (derandomized, fixed budget: the gate is reproducible), `dev`, `thorough`.

One definition for normcheck's own tests (conftest.py registers them) and for the suite the pytest
plugin runs on users' implementations (applied to that suite only, never loaded globally).
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PROFILES = {
    "ci": settings(derandomize=True, max_examples=40, database=None, **_COMMON),
    "dev": settings(max_examples=150, **_COMMON),
    "thorough": settings(max_examples=2000, **_COMMON),
}


def register_profiles() -> None:
    for name, profile in PROFILES.items():
        settings.register_profile(name, profile)
