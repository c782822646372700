"""The two autograd-aware collectives the textbook parallel norms are built from (Megatron's regions).

Both sum over the ranks of a group through normcheck.kernels.syncbn.collectives, so the same code runs in the
lockstep world (threads) and the gloo world (processes). Every rank calls them, empty shares included: a rank that
skipped one would leave its peers waiting.
"""
from __future__ import annotations

import torch

from ...frameworks.torch import accumulation_dtype
from ..syncbn.collectives import all_reduce


def _summed(t: torch.Tensor, group) -> torch.Tensor:
    """The sum of `t` over the ranks of `group`, in a fresh tensor (autograd's own may not be written to)."""
    total = t.contiguous().clone()
    all_reduce(total, group)
    return total


class ReduceGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the ranks: a replicated tensor (γ under sequence
    parallelism) gets the gradient of every rank's use of it, the same on every rank."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return _summed(grad, ctx.group), None


class SumOverRanks(torch.autograd.Function):
    """Forward sums a per-rank partial (a row's Σx² over its slice) over the ranks; backward sums the gradient too:
    every rank's total feeds its own slice of the output, so each partial's gradient is the sum of theirs."""

    @staticmethod
    def forward(ctx, partial, group):
        ctx.group = group
        return _summed(partial, group)

    @staticmethod
    def backward(ctx, grad):
        return _summed(grad, ctx.group), None


def reduce_gradient(t: torch.Tensor | None, group) -> torch.Tensor | None:
    return None if t is None else ReduceGradient.apply(t, group)


def sum_over_ranks(partial: torch.Tensor, group) -> torch.Tensor:
    return SumOverRanks.apply(partial, group)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half input (sums kept in float32), float64 for float64."""
    return accumulation_dtype(x.dtype)
