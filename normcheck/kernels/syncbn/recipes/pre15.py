"""Pre-1.5 style: every rank is assumed to hold the same number of elements. Statistics are merged
with equal weights, and each rank's MEAN dy terms are summed and divided by the world size.

Right only for even splits: on uneven or empty-rank splits it is expected to fail, and the
property suite asserts that it does (the harness must see it)."""
from __future__ import annotations

import torch

from .. import collectives
from .common import backward_outputs, channels_last_or_contiguous, gather_global_stats, input_grad, \
    local_backward_sums, normalise


class SyncBatchNormPre15(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        mean, invstd, _ = gather_global_stats(x, eps, momentum, running_mean, running_var, group, equal_counts=True)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.group, ctx.world_size = group, world_size
        return normalise(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = local_backward_sums(dy, x, mean, invstd, weight, needs)
        dx = None
        if needs[0]:
            local_count = x.numel() // x.shape[1]
            means = torch.cat([sum_dy, sum_dy_xmu]) / local_count  # 0/0 on an empty rank, as it was
            collectives.all_reduce(means, ctx.group)
            mean_dy, mean_dy_xmu = (means / ctx.world_size).split(x.shape[1])
            dx = input_grad(dy, x, mean, invstd, weight, mean_dy, mean_dy_xmu, torch.ones(1, dtype=torch.int32, device=x.device))
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    return SyncBatchNormPre15.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                    world_size)
