"""Sequence-parallel residual add + layernorm mutants and a correct local-gradient implementation
(tests/mutants/_parallel.py)."""
from ._parallel import add_sequence_catalogue

MUTANTS, CORRECT = add_sequence_catalogue("add_layernorm_sp", "layer_norm")
globals().update(MUTANTS)
