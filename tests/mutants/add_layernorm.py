"""Residual add + LayerNorm mutants and correct implementations (tests/mutants/_residual.py)."""
from normcheck.ops import layernorm
from normcheck.ops.residual import STREAM_RETURNED

from ._residual import catalogue
from .layernorm import textbook

MUTANTS, CORRECT = catalogue("add_layernorm", textbook, True, None,
                             {**layernorm.TORCHS, **STREAM_RETURNED})
globals().update(MUTANTS | CORRECT)
