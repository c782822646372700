"""Gated RMSNorm with the gate after the norm: mutants and correct implementations (tests/mutants/_gated.py)."""
from ._gated import catalogue

MUTANTS, CORRECT = catalogue(False)
globals().update(MUTANTS | CORRECT)
