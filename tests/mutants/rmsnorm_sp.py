"""Sequence-parallel rmsnorm mutants and a correct local-gradient implementation (tests/mutants/_parallel.py)."""
from ._parallel import sequence_catalogue

MUTANTS, CORRECT = sequence_catalogue("rmsnorm_sp", "rms_norm")
globals().update(MUTANTS)
