"""InplaceABN style: the forward keeps only its OUTPUT y (the input's memory is reused), and the
backward recovers x̂ = (y − β)/γ from it. Exact in real arithmetic; in floating point the rounding
of y is divided by γ, so the error grows as |γ| → 0. The property suite asserts that the report
shows exactly that growth."""
from __future__ import annotations

import torch

from .common import backward_outputs, channels_last_or_contiguous, gather_global_stats, global_backward_sums, \
    input_grad, normalise


class InplaceABNSync(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        mean, invstd, counts = gather_global_stats(x, eps, momentum, running_mean, running_var, group)
        y = normalise(x, weight, bias, mean, invstd, eps)
        ctx.save_for_backward(y, weight, bias, mean, invstd, counts)
        ctx.group, ctx.eps = group, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        y, weight, bias, mean, invstd, counts = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        x = _recover_input(y, weight, bias, mean, invstd)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = global_backward_sums(dy, x, mean, invstd, weight, needs,
                                                                          ctx.group)
        dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts) if needs[0] else None
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def _recover_input(y, weight, bias, mean, invstd):
    """x = (y − β)/γ/invstd + μ, as one batch_norm_elemt with the roles of the arguments swapped."""
    if y.numel() == 0:
        return y
    channels = y.shape[1]
    gamma = weight.to(mean.dtype) if weight is not None else torch.ones(channels, dtype=mean.dtype, device=y.device)
    beta = bias.to(mean.dtype) if bias is not None else torch.zeros(channels, dtype=mean.dtype, device=y.device)
    # elemt computes (in − m)·s·w + b: with m = β, s = 1/γ, w = 1/invstd, b = μ it gives x.
    return torch.batch_norm_elemt(y, invstd.reciprocal(), mean, beta, gamma.reciprocal(), 0.0)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    return InplaceABNSync.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                world_size)
