"""The pytorch-syncbn (DataParallel era) protocol: one thread per replica; replica 0 is the master.

Workers put their partial sums on the master's queue and read the global result from their own
queue; the master reduces and answers each worker. Unlike the original, partial statistics are
(count, mean, M2) triples merged with Chan's formula (not Σx and Σx²), counts are sent rather than
assumed equal, and float64 stays float64. Needs replicas that share memory: lockstep world only.
"""
from __future__ import annotations

import queue

import torch

from ....frameworks.torch import accumulation_dtype
from .common import channels_last_or_contiguous, input_grad, local_backward_sums, normalise, param_grads

QUEUE_TIMEOUT = 60.0


def _queues(group):
    """(master queue, one queue per worker), created once per world and shared by its replicas."""
    workers = group.size() - 1
    return group.shared.setdefault("master_worker_queues", (queue.Queue(), [queue.Queue() for _ in range(workers)]))


def _chan_merge(parts):
    """Merge (count, mean, M2) per channel over replicas: parallel variance without E[x²]−E[x]²."""
    count, mean, m2 = parts[0]
    for n_b, mean_b, m2_b in parts[1:]:
        total = count + n_b
        safe = torch.where(total > 0, total, torch.ones_like(total))
        delta = mean_b - mean
        mean = mean + delta * n_b / safe
        m2 = m2 + m2_b + delta * delta * count * n_b / safe
        count = total
    return count, mean, m2


def _sum_pairs(parts):
    return tuple(torch.stack(t).sum(0) for t in zip(*parts))


def _local_moments(x):
    acc = accumulation_dtype(x.dtype)
    channels = x.shape[1]
    if x.numel() == 0:
        zero = torch.zeros(channels, dtype=acc)
        return zero, zero.clone(), zero.clone()
    rows = x.transpose(0, 1).reshape(channels, -1).to(acc)
    n = torch.full((channels,), rows.shape[1], dtype=acc)
    mean = rows.mean(1)
    m2 = ((rows - mean[:, None]) ** 2).sum(1)
    return n, mean, m2


def _reduce_at_master(group, payload, reduce):
    """Replica 0 gathers every replica's payload from the master queue, reduces, answers each one."""
    master_q, worker_qs = _queues(group)
    rank = group.rank()
    if rank == 0:
        parts = {0: payload}
        for _ in range(group.size() - 1):
            sender, part = master_q.get(timeout=QUEUE_TIMEOUT)
            master_q.task_done()
            parts[sender] = part
        result = reduce([parts[r] for r in range(group.size())])
        for q in worker_qs:
            q.put(result)
        return result
    master_q.put((rank, payload))
    result = worker_qs[rank - 1].get(timeout=QUEUE_TIMEOUT)
    worker_qs[rank - 1].task_done()
    return result


class MasterWorkerSyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
        x = channels_last_or_contiguous(x)
        count, mean, m2 = _reduce_at_master(group, _local_moments(x), _chan_merge)
        total = count[0]
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_((momentum * mean).to(running_mean.dtype))
                unbiased = m2 / (total - 1)
                running_var.mul_(1 - momentum).add_((momentum * unbiased).to(running_var.dtype))
        counts = torch.tensor([int(total)], dtype=torch.int32)
        ctx.save_for_backward(x, weight, mean, invstd, counts)
        ctx.group = group
        return normalise(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = local_backward_sums(dy, x, mean, invstd, weight, needs)
        dx = None
        if needs[0]:  # (every replica alike: no dx, nothing to reduce)
            sum_dy, sum_dy_xmu = _reduce_at_master(ctx.group, (sum_dy, sum_dy_xmu), _sum_pairs)
            dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)
        if x.numel() == 0:
            return (dx, None, None) + (None,) * 6
        return (dx, *param_grads(weight, grad_weight, grad_bias, needs)) + (None,) * 6


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):
    if not hasattr(process_group, "shared"):
        raise TypeError("the master/worker protocol needs replicas sharing memory: run it in the lockstep world")
    return MasterWorkerSyncBN.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                    world_size)
