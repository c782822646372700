"""The collectives a SyncBN recipe uses, for a real torch.distributed group or a simulated one.

Recipes call these instead of torch.distributed directly so the same code runs in the gloo world
(a real ProcessGroup: these are thin calls into torch.distributed) and in the lockstep world
(normcheck.worlds.lockstep.LockstepGroup: ranks are threads meeting at barriers).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class Handle:
    """What an async collective returns: `wait()` completes it."""

    def __init__(self, wait):
        self._wait = wait

    def wait(self) -> None:
        self._wait()


def _simulated(group) -> bool:
    return hasattr(group, "simulated_all_reduce")


def all_reduce(tensor: torch.Tensor, group, async_op: bool = False) -> Handle | None:
    """Sum `tensor` over the ranks of `group`, in place."""
    if _simulated(group):
        handle = Handle(lambda: group.simulated_all_reduce(tensor))
    elif not async_op:  # waiting inside torch.distributed's own call lets a world's deadlock watch see the collective
        dist.all_reduce(tensor, dist.ReduceOp.SUM, group)
        return None
    else:
        work = dist.all_reduce(tensor, dist.ReduceOp.SUM, group, async_op=True)
        handle = Handle(work.wait)
    if async_op:
        return handle
    handle.wait()
    return None


def all_gather(tensor: torch.Tensor, group) -> torch.Tensor:
    """Every rank's `tensor`, stacked along a new leading dim (world_size, *tensor.shape)."""
    if _simulated(group):
        return group.simulated_all_gather(tensor)
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group)
    return torch.stack(parts)


def world_size(group) -> int:
    return group.size() if hasattr(group, "size") else dist.get_world_size(group)


def rank(group) -> int:
    return group.rank() if _simulated(group) else dist.get_rank(group)
