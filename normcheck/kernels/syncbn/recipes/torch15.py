"""torch 1.5–1.8 style: the combined sums are all-reduced, then divided by the TOTAL count to give
mean_dy and mean_dy_xmu, which the (pre-1.9) backward kernel took directly. Emulated with the
current kernel by passing the means as sums over a count of one."""
from __future__ import annotations

import torch

from .common import GatheredStatsForward, backward_outputs, channels_last_or_contiguous, global_backward_sums, \
    input_grad


class SyncBatchNorm15(GatheredStatsForward):
    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = global_backward_sums(dy, x, mean, invstd, weight, needs,
                                                                          ctx.group)
        dx = None
        if needs[0]:
            total = counts.sum()
            dx = input_grad(dy, x, mean, invstd, weight, sum_dy / total, sum_dy_xmu / total,
                            torch.ones(1, dtype=torch.int32, device=x.device))
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    return SyncBatchNorm15.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                 world_size)
