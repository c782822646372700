"""Pieces several recipes share: per-rank statistics and their all-gather merge."""
from __future__ import annotations

import torch

from ....frameworks.torch import accumulation_dtype
from .. import collectives


def channels_last_or_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The primitives read contiguous or channels-last tensors; anything else is made contiguous."""
    for fmt in (torch.channels_last, torch.channels_last_3d):
        if t.dim() == (4 if fmt is torch.channels_last else 5) and t.is_contiguous(memory_format=fmt):
            return t
    return t.contiguous()


def local_stats(x: torch.Tensor, eps: float) -> torch.Tensor:
    """[mean (C), invstd (C), count (1)] of this rank's slice; zeros for an empty rank, which must
    still take part in the gather (in the statistics dtype, so every rank sends the same dtype)."""
    channels = x.shape[1]
    if x.numel() == 0:
        return torch.zeros(2 * channels + 1, dtype=accumulation_dtype(x.dtype), device=x.device)
    mean, invstd = torch.batch_norm_stats(x, eps)
    count = torch.full((1,), x.numel() // channels, dtype=mean.dtype, device=x.device)
    return torch.cat([mean, invstd, count])


def gather_global_stats(x, eps, momentum, running_mean, running_var, group, equal_counts: bool = False):
    """All-gather every rank's (mean, invstd, count) and merge them with batch_norm_gather_stats_with_counts.

    Returns (mean, invstd, per-rank counts as int32). `equal_counts` reproduces the pre-1.5
    assumption that every rank holds as many elements as this one.
    """
    channels = x.shape[1]
    gathered = collectives.all_gather(local_stats(x, eps), group)
    mean_all, invstd_all, count_all = torch.split(gathered, channels, dim=1)
    counts = count_all.reshape(-1)
    if equal_counts:
        counts = torch.full_like(counts, x.numel() // channels)
    keep = counts >= 1  # empty ranks carry no statistics
    mean_all, invstd_all, counts = mean_all[keep], invstd_all[keep], counts[keep]
    if running_mean is not None:
        counts = counts.to(running_mean.dtype)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts)
    return mean, invstd, count_all.reshape(-1).to(torch.int32)


class GatheredStatsForward(torch.autograd.Function):
    """The forward most recipes share: all-gather the per-rank statistics, merge them, normalise.

    Saves (x, weight, mean, invstd, per-rank counts) and the group; subclasses write the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        mean, invstd, counts = gather_global_stats(x, eps, momentum, running_mean, running_var, group)
        ctx.save_for_backward(x, weight, mean, invstd, counts)
        ctx.group = group
        return normalise(x, weight, bias, mean, invstd, eps)


def normalise(x, weight, bias, mean, invstd, eps):
    if x.numel() == 0:
        return torch.empty_like(x)
    return torch.batch_norm_elemt(x, weight, bias, mean, invstd, eps)


def local_backward_sums(dy, x, mean, invstd, weight, needs):
    """This rank's (Σdy, Σdy·(x − μ)) and local dγ, dβ; zeros for an empty rank."""
    if x.numel() == 0:
        zeros = torch.zeros(x.shape[1], dtype=mean.dtype, device=x.device)
        return zeros, zeros.clone(), None, None
    sums = torch.batch_norm_backward_reduce(dy, x, mean, invstd, weight, *needs[:3])
    if weight is None and needs[2]:  # the primitive rounds dβ to x's dtype when there is no weight to take one from
        sums = sums[:3] + (dy.sum([d for d in range(dy.dim()) if d != 1], dtype=mean.dtype),)
    return sums


def global_backward_sums(dy, x, mean, invstd, weight, needs, group):
    """The ≥ 1.9 backward's first half: local sums, then ONE all-reduce of [Σdy, Σdy·(x − μ)].

    Returns (global Σdy, global Σdy·(x − μ), local dγ, local dβ). Without an input gradient to
    compute there is nothing to synchronise (every rank skips the collective alike)."""
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = local_backward_sums(dy, x, mean, invstd, weight, needs)
    if needs[0]:
        combined = torch.cat([sum_dy, sum_dy_xmu])
        collectives.all_reduce(combined, group)
        sum_dy, sum_dy_xmu = torch.split(combined, x.shape[1])
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts):
    """dx from the GLOBAL sums and the per-rank counts (int32), with the torch ≥ 1.9 kernel."""
    if x.numel() == 0:
        return None
    return torch.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)


def backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra: int):
    """autograd's tuple: dx, dγ, dβ, then None for the `extra` non-tensor arguments."""
    if x.numel() == 0:
        return (dx, None, None) + (None,) * extra
    return (dx, *param_grads(weight, grad_weight, grad_bias, needs)) + (None,) * extra


def param_grads(weight, grad_weight, grad_bias, needs):
    """Local dγ/dβ as autograd wants them (None where not needed); the optimizer-side all-reduce
    of parameter gradients is the training loop's job, not SyncBN's. A bias without a weight still gets
    its gradient (torch's Function drops it: torch-syncbn-bias-without-weight)."""
    if weight is None or not needs[1]:
        grad_weight = None
    if not needs[2]:
        grad_bias = None
    return grad_weight, grad_bias


def eval_forward(x, weight, bias, running_mean, running_var, eps):
    """Eval mode, as nn.SyncBatchNorm has it (no collective): the running statistics, in the accumulation dtype,
    composite ops, so autograd differentiates it (twice, too)."""
    acc = accumulation_dtype(x.dtype)
    shape = [1, -1] + [1] * (x.dim() - 2)
    scale = (running_var.to(acc) + eps).rsqrt().view(shape)
    y = (x.to(acc) - running_mean.to(acc).view(shape)) * scale
    if weight is not None:
        y = y * weight.to(acc).view(shape)
    if bias is not None:
        y = y + bias.to(acc).view(shape)
    return y.to(x.dtype)
