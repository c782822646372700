"""Sequence-parallel layernorm mutants and a correct local-gradient implementation (tests/mutants/_parallel.py)."""
from ._parallel import sequence_catalogue

MUTANTS, CORRECT = sequence_catalogue("layernorm_sp", "layer_norm")
globals().update(MUTANTS)
