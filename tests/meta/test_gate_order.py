"""The gate's schedule (conftest.py): the files it names first exist, and pytest-xdist keeps the order they are
collected in (its own reordering by number of tests would start the longest-waiting file last)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gate_conftest", ROOT / "conftest.py")  # (not benchmarks/conftest.py)
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
FIRST = _conftest.FIRST


def test_the_files_the_gate_starts_first_exist():
    assert len(set(FIRST)) == len(FIRST) and [path for path in FIRST if not (ROOT / path).is_file()] == []


def test_xdist_hands_files_out_in_collection_order(pytestconfig):
    if not hasattr(pytestconfig.option, "loadscopereorder"):
        pytest.skip("pytest-xdist is not installed: the gate's schedule does not apply")
    assert pytestconfig.option.loadscopereorder is False
