"""torch ≥ 1.9 style: sum_dy and sum_dy_xmu travel in ONE combined all-reduce, the backward kernel
takes sums plus an int32 per-rank count tensor, and empty ranks still join every collective."""
from __future__ import annotations

from .common import GatheredStatsForward, backward_outputs, channels_last_or_contiguous, eval_forward, \
    global_backward_sums, input_grad


class SyncBatchNorm19(GatheredStatsForward):
    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = global_backward_sums(dy, x, mean, invstd, weight, needs,
                                                                          ctx.group)
        dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts) if needs[0] else None
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size,
                    training=True):
    if not training:  # as torch.nn.SyncBatchNorm: eval mode is plain BatchNorm with the running statistics
        return eval_forward(input, weight, bias, running_mean, running_var, eps)
    return SyncBatchNorm19.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                 world_size)
