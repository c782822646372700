"""The two autograd-aware collectives the textbook parallel norms are built from (Megatron's regions).

Both sum over the ranks of a group through normcheck.kernels.syncbn.collectives, so the same code runs in the
lockstep world (threads) and the gloo world (processes). Every rank calls them, empty shares included: a rank that
skipped one would leave its peers waiting.
"""
from __future__ import annotations

import torch

from ..syncbn.collectives import all_reduce


class ReduceGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the ranks: a replicated tensor (γ under sequence
    parallelism) gets the gradient of every rank's use of it, the same on every rank."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        all_reduce(grad, ctx.group)
        return grad, None


class SumOverRanks(torch.autograd.Function):
    """Forward sums a per-rank partial (a row's Σx² over its slice) over the ranks; backward sums the gradient too:
    every rank's total feeds its own slice of the output, so each partial's gradient is the sum of theirs."""

    @staticmethod
    def forward(ctx, partial, group):
        ctx.group = group
        total = partial.contiguous().clone()
        all_reduce(total, group)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        all_reduce(grad, ctx.group)
        return grad, None


def reduce_gradient(t: torch.Tensor | None, group) -> torch.Tensor | None:
    return None if t is None else ReduceGradient.apply(t, group)


def sum_over_ranks(partial: torch.Tensor, group) -> torch.Tensor:
    return SumOverRanks.apply(partial, group)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half input (sums kept in float32), float64 for float64."""
    return torch.promote_types(x.dtype, torch.float32)
