"""The gate's schedule (conftest.py): the files it names first exist, and pytest-xdist keeps the order they are
collected in (its own reordering by number of tests would start the longest-waiting file last)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_files_the_gate_starts_first_exist(pytestconfig):
    # (the root conftest as pytest loaded it: `import conftest` would find benchmarks/conftest.py)
    first = pytestconfig.pluginmanager.get_plugin(str(ROOT / "conftest.py")).FIRST
    assert len(set(first)) == len(first) and [path for path in first if not (ROOT / path).is_file()] == []


def test_xdist_hands_files_out_in_collection_order(pytestconfig):
    if not hasattr(pytestconfig.option, "loadscopereorder"):
        pytest.skip("pytest-xdist is not installed: the gate's schedule does not apply")
    assert pytestconfig.option.loadscopereorder is False
