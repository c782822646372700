"""Hidden-parallel rmsnorm mutants (tests/mutants/_parallel.py)."""
from ._parallel import hidden_catalogue

MUTANTS, CORRECT = hidden_catalogue("rmsnorm_hp", "rms_norm")
globals().update(MUTANTS)
