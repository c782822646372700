"""Hidden-parallel layernorm mutants (tests/mutants/_parallel.py)."""
from ._parallel import hidden_catalogue

MUTANTS, CORRECT = hidden_catalogue("layernorm_hp", "layer_norm")
globals().update(MUTANTS)
