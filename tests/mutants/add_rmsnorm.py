"""Residual add + RMSNorm mutants and correct implementations (tests/mutants/_residual.py)."""
import torch

from normcheck.ops import rmsnorm
from normcheck.ops.residual import STREAM_RETURNED

from ._residual import catalogue
from .rmsnorm import textbook


def _default_eps(dtype):
    return rmsnorm.default_eps({torch.float64: "f64"}.get(dtype, "f32"))


MUTANTS, CORRECT = catalogue("add_rmsnorm", textbook, False, _default_eps,
                             {**rmsnorm.TORCHS, **STREAM_RETURNED})
globals().update(MUTANTS | CORRECT)
