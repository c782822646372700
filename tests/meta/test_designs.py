"""The covering arrays normcheck ships (normcheck/cases/designs): one for every default sweep, each what covertable
builds, and nothing else, so that a fresh machine builds none of the default sweeps' arrays."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from normcheck.cases import covering
from normcheck.cases.sweep import narrowed_design, sweep_levels

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ship_designs.py"


def _script():
    spec = importlib.util.spec_from_file_location("ship_designs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _designs() -> dict[str, tuple]:
    """{key: (factors, exclusions)} of every default sweep whose array ships."""
    return {covering.design_key(*d): d for d in _script().shipped_designs()}


def test_every_default_sweeps_array_ships_and_nothing_else():
    designs = _designs()
    on_disk = {path.stem for path in covering.SHIPPED.glob("*.json")}
    missing = sorted(set(designs) - on_disk)
    assert not missing, f"{len(missing)} default sweeps' arrays are not shipped: run python scripts/ship_designs.py"
    assert on_disk == set(designs), "arrays no default sweep uses are shipped: run python scripts/ship_designs.py"
    unfit = [key for key, (fs, _) in designs.items() if not covering._fits(covering.shipped(key), fs)]
    assert not unfit


def test_a_shipped_array_is_what_covertable_builds():
    # (tests/meta/test_sweep.py: groupnorm's, built in another process under another hash seed)
    fs, excluded = narrowed_design("batchnorm", sweep_levels())
    shipped = json.loads((covering.SHIPPED / f"{covering.design_key(fs, excluded)}.json").read_text())
    assert shipped == covering._stored_form(fs, covering.built(fs, excluded))
