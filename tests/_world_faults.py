"""SyncBN implementations that fail on purpose, written against normcheck's collectives so they run
in every world (tests/test_worlds.py). All follow the syncbn contract."""
import os
import time

import torch

from normcheck.kernels.syncbn import collectives
from normcheck.kernels.syncbn.recipes.torch19 import sync_batch_norm

HANG_SECONDS = 30  # far beyond the tests' per-case timeout: the world must give up on the rank


def raises_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    if collectives.rank(group) == 1:
        raise ValueError("rank 1 refuses on purpose")
    return sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def hangs_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """Rank 1 never reaches the first collective: its peers wait there."""
    if collectives.rank(group) == 1:
        time.sleep(HANG_SECONDS)
    return sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def sleeps_on_rank1(seconds: float):
    """Rank 1 sleeps `seconds` before the first collective (a hang that ends): its run gives up on it first."""
    def sleeps(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        if collectives.rank(group) == 1:
            time.sleep(seconds)
        return sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)
    return sleeps


def dies_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    if collectives.rank(group) == 1:
        os._exit(3)
    return sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


class _Linger(torch.autograd.Function):
    """Identity on x whose backward, the last step of a rank's case, first sleeps `seconds`."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, dx):
        time.sleep(ctx.seconds)
        return dx, None


def grad_lost_on_rank0_while_rank2_lingers(x, weight, bias, running_mean, running_var, eps, momentum, group,
                                           world_size):
    """Every rank joins every collective; then rank 0 fails (no dγ), rank 1 returns, rank 2 is still busy."""
    rank = collectives.rank(group)
    w = weight.detach() if rank == 0 and weight is not None else weight
    return sync_batch_norm(_Linger.apply(x, 3.0 if rank == 2 else 0.0), w, bias, running_mean, running_var, eps,
                           momentum, group, world_size)
