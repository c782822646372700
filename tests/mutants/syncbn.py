"""SyncBN mutants: the torch ≥ 1.9 recipe with one distributed-specific bug switched on.

They use the syncbn contract, so they also work as
`normcheck compare --op syncbn --impl tests.mutants.syncbn:mean_dy_over_world_size --backend lockstep`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from normcheck.kernels.syncbn import collectives
from normcheck.kernels.syncbn.recipes.common import backward_outputs, channels_last_or_contiguous, \
    gather_global_stats, input_grad, local_backward_sums, normalise


class _Mutant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, world_size, bug):
        x = channels_last_or_contiguous(x)
        if bug == "skip_collectives_when_empty" and x.numel() == 0:
            ctx.save_for_backward(x, weight, torch.zeros(x.shape[1]), torch.ones(x.shape[1]),
                                  torch.zeros(1, dtype=torch.int32))
            ctx.group, ctx.bug, ctx.world_size = group, bug, world_size
            return torch.empty_like(x)
        if bug == "biased_running_var":
            mean, invstd, counts = gather_global_stats(x, eps, momentum, None, None, group)
            if running_mean is not None:
                with torch.no_grad():
                    biased = invstd.double().pow(-2) - eps
                    running_mean.mul_(1 - momentum).add_((momentum * mean).to(running_mean.dtype))
                    running_var.mul_(1 - momentum).add_((momentum * biased).to(running_var.dtype))
        else:
            mean, invstd, counts = gather_global_stats(x, eps, momentum, running_mean, running_var, group)
        ctx.save_for_backward(x, weight, mean, invstd, counts)
        ctx.group, ctx.bug, ctx.world_size = group, bug, world_size
        return normalise(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        bug = ctx.bug
        if bug == "skip_collectives_when_empty" and x.numel() == 0:
            return backward_outputs(x, None, weight, None, None, ctx.needs_input_grad, extra=7)
        dy = channels_last_or_contiguous(dy)
        needs = ctx.needs_input_grad
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = local_backward_sums(dy, x, mean, invstd, weight, needs)
        if bug == "param_grads_all_reduced" and grad_weight is not None:
            collectives.all_reduce(grad_weight, ctx.group)  # the training loop all-reduces them again
            collectives.all_reduce(grad_bias, ctx.group)
        if not needs[0]:  # no dx to compute: nothing to synchronise (every rank alike)
            return backward_outputs(x, None, weight, grad_weight, grad_bias, needs, extra=7)
        combined = torch.cat([sum_dy, sum_dy_xmu])
        collectives.all_reduce(combined, ctx.group)
        sum_dy, sum_dy_xmu = torch.split(combined, x.shape[1])
        if bug == "mean_dy_over_world_size":
            # Every rank assumed to hold as many elements as this one: total = W · local count.
            counts = torch.full_like(counts, x.numel() // x.shape[1])
        if bug == "count_in_input_dtype":
            counts = counts.to(x.dtype)  # torch's primitives read the count as int32
        dx = input_grad(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)
        return backward_outputs(x, dx, weight, grad_weight, grad_bias, needs, extra=7)


def _mutant(bug: str):
    def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size,
                        training=True):
        if not training and bug != "eval_uses_batch_stats":  # eval mode: the running statistics, no collective
            y = F.batch_norm(input, running_mean.clone(), running_var.clone(), weight, bias, False, momentum, eps)
            if bug == "eval_updates_running_stats" and input.numel():  # and a training-style update of them
                with torch.no_grad():
                    dims = [d for d in range(input.dim()) if d != 1]
                    running_mean.mul_(1 - momentum).add_(momentum * input.mean(dims).to(running_mean.dtype))
                    running_var.mul_(1 - momentum).add_(momentum * input.var(dims).to(running_var.dtype))
            return y
        return _Mutant.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size,
                             bug)
    sync_batch_norm.__qualname__ = bug
    return sync_batch_norm


BUGS = ("mean_dy_over_world_size", "param_grads_all_reduced", "biased_running_var", "skip_collectives_when_empty",
        "count_in_input_dtype", "eval_uses_batch_stats", "eval_updates_running_stats")
MUTANTS = {bug: _mutant(bug) for bug in BUGS}
globals().update(MUTANTS)
CORRECT: dict = {}  # the correct SyncBN implementations are the recipes (normcheck.kernels.syncbn.recipes)
