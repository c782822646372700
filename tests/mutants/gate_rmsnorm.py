"""Gated RMSNorm with the gate before the norm: mutants and correct implementations (tests/mutants/_gated.py)."""
from ._gated import catalogue

MUTANTS, CORRECT = catalogue(True)
globals().update(MUTANTS | CORRECT)
