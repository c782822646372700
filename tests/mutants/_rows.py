"""What the row-wise mutant modules share (layernorm_std, rmsnorm_eps_out, simplenorm, scalenorm): the input as rows,
and a root and a reciprocal written so that their own derivatives are finite where the value is 0 (a zero row, a row
of equal values), which a double backward differentiates."""
from __future__ import annotations

import torch


def rows_of(input, normalized_shape):
    """input as (rows, H)."""
    return input.reshape(-1, input.shape[input.dim() - len(normalized_shape):].numel())


def root(v):
    """√v where v > 0, else 0 (its derivative there 0, as x.norm()'s is)."""
    positive = v > 0
    return torch.where(positive, torch.where(positive, v, torch.ones_like(v)).sqrt(), torch.zeros_like(v))


def reciprocal(v):
    """1/v where v > 0, else 0 (its derivative there 0)."""
    moving = v > 0
    return torch.where(moving, 1 / torch.where(moving, v, torch.ones_like(v)), torch.zeros_like(v))
