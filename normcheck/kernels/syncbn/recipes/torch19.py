"""torch ≥ 1.9 style: sum_dy and sum_dy_xmu travel in ONE combined all-reduce, the backward kernel
takes sums plus an int32 per-rank count tensor, and empty ranks still join every collective."""
from __future__ import annotations

import torch

from .common import backward_outputs, channels_last_or_contiguous, gather_global_stats, global_backward_sums, \
    input_grad, normalise


class SyncBatchNorm19(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        mean, invstd, counts = gather_global_stats(x, eps, momentum, running_mean, running_var, group)
        ctx.save_for_backward(x, weight, mean, invstd, counts)
        ctx.group = group
        return normalise(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = global_backward_sums(dy, x, mean, invstd, weight, needs,
                                                                          ctx.group)
        dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts) if needs[0] else None
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    return SyncBatchNorm19.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                 world_size)
