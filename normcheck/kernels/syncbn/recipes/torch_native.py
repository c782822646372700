"""torch's own SyncBatchNorm autograd Function, used exactly as torch ships it.

On CPU it runs because normcheck registers CPU kernels for the aten SyncBN primitives. It calls
torch.distributed itself, so it needs a real process group: the gloo or env world.
"""
from __future__ import annotations

from torch.nn.modules._functions import SyncBatchNorm


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    return SyncBatchNorm.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                               world_size)
