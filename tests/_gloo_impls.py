"""SyncBN implementations for the gloo/env world tests: one correct, and ones whose ranks misbehave.

All follow the syncbn contract
``fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)``
and call torch.distributed themselves. Load them by spec: ``f"{path_of_this_file}:sync_bn"``.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

HANG_SECONDS = 600  # far beyond any test timeout: the world must kill the rank


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.view([1, -1] + [1] * (x.dim() - 2))


class _SyncBN(torch.autograd.Function):
    """Forward: all_gather each rank's (count, mean, M2) and Chan-merge them (no E[x²]−E[x]²).
    Backward: all_reduce Σdy and Σdy·x̂ (empty ranks contribute zeros), local dweight/dbias."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        c = x.shape[1]
        count = x.numel() // c
        xd = x.double()
        if count:
            mean = xd.mean(_dims(x))
            m2 = ((xd - _per_channel(mean, x)) ** 2).sum(_dims(x))
        else:
            mean = m2 = torch.zeros(c, dtype=torch.float64)
        stats = torch.stack([torch.full((c,), float(count), dtype=torch.float64), mean, m2])
        parts = [torch.empty_like(stats) for _ in range(world_size)]
        dist.all_gather(parts, stats, group=group)
        n = torch.zeros(c, dtype=torch.float64)
        g_mean = torch.zeros(c, dtype=torch.float64)
        g_m2 = torch.zeros(c, dtype=torch.float64)
        for nb, mb, m2b in parts:  # Chan et al.'s pairwise merge, ranks in order
            if nb[0] == 0:
                continue
            total = n + nb
            delta = mb - g_mean
            g_mean = g_mean + delta * (nb / total)
            g_m2 = g_m2 + m2b + delta * delta * (n * nb / total)
            n = total
        invstd = torch.rsqrt(g_m2 / n + eps)
        xhat = (xd - _per_channel(g_mean, x)) * _per_channel(invstd, x)
        y = xhat
        if weight is not None:
            y = y * _per_channel(weight.double(), x)
        if bias is not None:
            y = y + _per_channel(bias.double(), x)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * g_mean.to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_(momentum * (g_m2 / (n - 1)).to(running_var.dtype))
        ctx.save_for_backward(xhat, weight, invstd, n)
        ctx.group = group
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd, n = ctx.saved_tensors
        dyd = dy.double()
        local = torch.stack([dyd.sum(_dims(dy)), (dyd * xhat).sum(_dims(dy))])
        total = local.clone()
        dist.all_reduce(total, group=ctx.group)
        scale = invstd if weight is None else invstd * weight.double()
        dx = _per_channel(scale, dy) * (dyd - _per_channel(total[0] / n, dy) - xhat * _per_channel(total[1] / n, dy))
        dweight = local[1].to(weight.dtype) if weight is not None else None
        dbias = local[0].to(ctx.bias_dtype) if ctx.bias_dtype is not None else None  # (in β's own dtype)
        return dx.to(dy.dtype), dweight, dbias, None, None, None, None, None, None


def sync_bn(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """A correct SyncBN."""
    return _SyncBN.apply(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def _rank(group) -> int:
    return dist.get_rank(group)


def raises_on_rank2(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    if _rank(group) == 2:
        raise ValueError("rank 2 refuses on purpose")
    return sync_bn(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def raises_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    if _rank(group) == 1:
        raise ValueError("rank 1 refuses on purpose")
    return sync_bn(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def raises_everywhere(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    raise NotImplementedError(f"no kernel for {x.dtype}")


def hangs_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """Rank 1 never reaches the forward all_gather: its peers wait there."""
    if _rank(group) == 1:
        time.sleep(HANG_SECONDS)
    return sync_bn(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


class _HangsAfterCollectives(_SyncBN):
    @staticmethod
    def backward(ctx, dy):
        grads = _SyncBN.backward(ctx, dy)
        if _rank(ctx.group) == 1:
            time.sleep(HANG_SECONDS)  # after the last collective: the peers finish the case
        return grads


def hangs_after_collectives_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group,
                                     world_size):
    return _HangsAfterCollectives.apply(x, weight, bias, running_mean, running_var, eps, momentum, group,
                                        world_size)


def dies_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    if _rank(group) == 1:
        os._exit(3)
    return sync_bn(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def wrong_shape_on_rank0(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    y = sync_bn(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)
    return y[:, :-1] if _rank(group) == 0 else y


class _SkipsAllReduceWhenEmpty(_SyncBN):
    """The backward of an empty rank returns at once, as if it had nothing to add: its peers wait in all_reduce."""

    @staticmethod
    def backward(ctx, dy):
        if dy.numel() == 0:
            return (torch.zeros_like(dy),) + (None,) * 8
        return _SyncBN.backward(ctx, dy)


def skips_all_reduce_when_empty(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    return _SkipsAllReduceWhenEmpty.apply(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)


def skips_all_gather_when_empty(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """An empty rank returns its empty output at once: its peers wait in the forward's all_gather."""
    if x.numel() == 0:
        return x * 1
    return _SyncBN.apply(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)
