"""Horovod style: counts, means and invstds gathered in three separate collectives; in backward,
Σdy and Σdy·(x − μ) go out as two separate ASYNC all-reduces that are waited on in turn."""
from __future__ import annotations

import torch

from .. import collectives
from .common import backward_outputs, channels_last_or_contiguous, input_grad, local_backward_sums, \
    local_stats, normalise


class HorovodSyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        channels = x.shape[1]
        mine = local_stats(x, eps)
        count_all = collectives.all_gather(mine[-1:], group).reshape(-1)
        mean_all = collectives.all_gather(mine[:channels], group)
        invstd_all = collectives.all_gather(mine[channels:2 * channels], group)
        keep = count_all >= 1
        counts = count_all[keep].to(running_mean.dtype if running_mean is not None else count_all.dtype)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            x, mean_all[keep], invstd_all[keep], running_mean, running_var, momentum, eps, counts)
        ctx.save_for_backward(x, weight, mean, invstd, count_all.to(torch.int32))
        ctx.group = group
        return normalise(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = local_backward_sums(dy, x, mean, invstd, weight, needs)
        dx = None
        if needs[0]:
            sum_dy, sum_dy_xmu = sum_dy.clone(), sum_dy_xmu.clone()
            first = collectives.all_reduce(sum_dy, ctx.group, async_op=True)
            second = collectives.all_reduce(sum_dy_xmu, ctx.group, async_op=True)
            first.wait()
            second.wait()
            dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    return HorovodSyncBatchNorm.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                      world_size)
