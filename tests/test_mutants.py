"""The default sweep catches every mutant and passes every correct implementation (item 8).

This is the proof that the tolerance model and the sweep see the bug classes: a mutant that slips
through means a blind spot, a correct implementation that fails means a false alarm.
"""
import pytest

from normcheck import compare
from normcheck.compare import FAIL
from normcheck.sweep import default_sweep
from tests import mutants

SWEEPS = {op: default_sweep(op) for op in ("batchnorm", "groupnorm")}
MUTANTS = [("batchnorm", name) for name in mutants.BN_MUTANTS] + [("groupnorm", name) for name in mutants.GN_MUTANTS]


@pytest.mark.parametrize("op, name", MUTANTS, ids=[f"{op}-{name}" for op, name in MUTANTS])
def test_default_sweep_catches_mutant(op, name):
    fn = (mutants.BN_MUTANTS if op == "batchnorm" else mutants.GN_MUTANTS)[name]
    caught = next((r for r in (compare(op, fn, case) for case in SWEEPS[op]) if r.verdict == FAIL), None)
    assert caught is not None, f"{op} mutant {name} passed the whole default sweep"


@pytest.mark.parametrize("op, impl", [("batchnorm", "torch"), ("batchnorm", "torch-native-backward"),
                                      ("groupnorm", "torch"), ("groupnorm", "torch-native-backward"),
                                      ("batchnorm", "textbook"), ("groupnorm", "textbook")])
def test_default_sweep_passes_correct_implementations(op, impl):
    if impl == "textbook":
        impl = mutants.bn_textbook if op == "batchnorm" else mutants.gn_textbook
    failures = [f"{r.case.label}: {r.summary()}" for r in (compare(op, impl, c) for c in SWEEPS[op])
                if r.verdict == FAIL]
    assert not failures, failures[:5]
