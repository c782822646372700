"""Fused SyncBN + SiLU with recompute: the forward returns SiLU(BN(x)) and saves x (not BN(x));
the backward recomputes BN(x), turns dz into dy = dz·σ(y)·(1 + y·(1 − σ(y))) and runs the ≥ 1.9
SyncBN backward. Unlike the fused kernel it learns from, it does not scale grad_output in place."""
from __future__ import annotations

import torch

from ....frameworks.torch import accumulation_dtype
from .common import backward_outputs, channels_last_or_contiguous, eval_forward, gather_global_stats, \
    global_backward_sums, input_grad, normalise


def _silu_grad(y: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(y)
    return s * (1 + y * (1 - s))


class SyncBatchNormSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        mean, invstd, counts = gather_global_stats(x, eps, momentum, running_mean, running_var, group)
        ctx.save_for_backward(x, weight, bias, mean, invstd, counts)
        ctx.group, ctx.eps = group, eps
        y = normalise(x, weight, bias, mean, invstd, eps)
        return torch.nn.functional.silu(y.to(accumulation_dtype(x.dtype))).to(x.dtype)

    @staticmethod
    def backward(ctx, dz):
        x, weight, bias, mean, invstd, counts = ctx.saved_tensors
        acc = accumulation_dtype(x.dtype)
        y = normalise(x, weight, bias, mean, invstd, ctx.eps).to(acc)  # recomputed, not saved
        dy = channels_last_or_contiguous((dz.to(acc) * _silu_grad(y)).to(x.dtype))
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = global_backward_sums(dy, x, mean, invstd, weight, needs,
                                                                          ctx.group)
        dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts) if needs[0] else None
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=6)


def sync_batch_norm_silu(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size,
                         training=True):
    if not training:  # the running statistics: no collective, autograd through the composite
        y = eval_forward(input, weight, bias, running_mean, running_var, eps)  # (rounded to the input dtype, as
        return torch.nn.functional.silu(y.to(accumulation_dtype(input.dtype))).to(input.dtype)  # the training path)
    return SyncBatchNormSiLU.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                   world_size)
