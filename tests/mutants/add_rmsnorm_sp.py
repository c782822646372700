"""Sequence-parallel residual add + rmsnorm mutants and a correct local-gradient implementation
(tests/mutants/_parallel.py)."""
from ._parallel import add_sequence_catalogue

MUTANTS, CORRECT = add_sequence_catalogue("add_rmsnorm_sp", "rms_norm")
globals().update(MUTANTS)
