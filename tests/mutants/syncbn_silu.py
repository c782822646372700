"""Fused SyncBN + SiLU mutants (the syncbn contract, returning SiLU(SyncBN(input)))."""
from __future__ import annotations

import torch

from normcheck.kernels.syncbn.recipes.torch19 import sync_batch_norm


def silu_backward_skipped(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    """Fused BN + SiLU whose backward forgets the SiLU factor (passes dz straight to BN)."""
    y = sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)
    silu = torch.nn.functional.silu(y.detach().float()).to(y.dtype)
    return y + (silu - y).detach()  # forward value SiLU(y), gradient of plain BN


MUTANTS = {"silu_backward_skipped": silu_backward_skipped}
CORRECT: dict = {}
