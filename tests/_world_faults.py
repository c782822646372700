"""SyncBN implementations that fail on purpose, written against normcheck's collectives so they run
in every world (tests/test_worlds.py). All follow the syncbn contract."""
import os
import time

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


def dies_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    if collectives.rank(group) == 1:
        os._exit(3)
    return sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)
