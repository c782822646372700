"""Implementations that print while they run (tests/test_printed.py): what a user's debugging output looks like."""
from __future__ import annotations

import sys

import torch.nn.functional as F


def layer_norm_eps_forgotten(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Wrong wherever eps matters (it adds 0.1), and says what it was given: the clue a failing row should show."""
    print(f"layer_norm: x {tuple(x.shape)} {x.dtype}, eps {eps}")
    print("layer_norm: taking eps = 0.1", file=sys.stderr)
    return F.layer_norm(x, normalized_shape, weight, bias, 0.1)


def layer_norm_chatty(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Right, and prints 30 lines per call."""
    for i in range(30):
        print(f"line {i}")
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def layer_norm_prints_then_raises(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    print("about to fail")
    raise RuntimeError("no kernel for this shape")


def sync_batch_norm_rank1_off(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """SyncBN whose rank 1 doubles its output, each rank saying who it is."""
    from normcheck.kernels.syncbn import collectives
    from normcheck.kernels.syncbn.recipes.torch19 import sync_batch_norm

    rank = collectives.rank(group)
    print(f"rank {rank} of {world_size}: x {tuple(x.shape)}")
    y = sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)
    return y * 2 if rank == 1 else y
