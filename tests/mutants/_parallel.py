"""Parallel-norm mutants: the textbook sequence- and hidden-parallel norms (normcheck.kernels.parallel) with one
reduction bug each, the kinds shipped by training frameworks: a replicated γ's gradient never reduced, averaged
instead of summed, or reduced on some ranks only; a row's statistics from the rank's own slice, or divided by its
own share instead of the whole hidden size; γ taken at the offset an even split would give.

They take the ops' contract, so `normcheck compare --op layernorm_sp --impl tests.mutants.layernorm_sp:NAME`
runs one.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normcheck.kernels.parallel.reductions import compute_dtype, sum_over_ranks
from normcheck.kernels.syncbn import collectives
from normcheck.ops import Impl


class _BadReduction(torch.autograd.Function):
    """Identity forward; backward reduces the gradient the wrong way (`bug`)."""

    @staticmethod
    def forward(ctx, t, group, bug):
        ctx.group, ctx.bug = group, bug
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        total = grad.contiguous().clone()
        if ctx.bug == "no_grad_reduction":
            return total, None, None
        collectives.all_reduce(total, ctx.group)  # every rank joins: these bugs do not hang
        if ctx.bug == "grad_mean_not_sum":
            total = total / collectives.world_size(ctx.group)
        if ctx.bug == "grad_reduced_on_rank_0_only" and collectives.rank(ctx.group) != 0:
            total = grad.contiguous().clone()  # the others keep their partial sums
        return total, None, None


def _sequence(op: str, norm: str, bug: str):
    def wrapped(p, dtype, group):
        return None if p is None else _BadReduction.apply(p.to(dtype), group, bug)

    if norm == "layer_norm":
        def fn(input, normalized_shape, weight, bias, eps, process_group, world_size, offset):
            dtype = compute_dtype(input)
            return F.layer_norm(input.to(dtype), normalized_shape, wrapped(weight, dtype, process_group),
                                wrapped(bias, dtype, process_group), eps).to(input.dtype)
    else:
        def fn(input, normalized_shape, weight, eps, process_group, world_size, offset):
            dtype = compute_dtype(input)
            return F.rms_norm(input.to(dtype), normalized_shape, wrapped(weight, dtype, process_group),
                              eps).to(input.dtype)
    fn.__qualname__ = fn.__name__ = bug
    fn.__module__ = f"tests.mutants.{op}"  # (where the ranks load it from)
    return fn


SEQUENCE_BUGS = ("no_grad_reduction", "grad_mean_not_sum", "grad_reduced_on_rank_0_only")


def sequence_catalogue(op: str, norm: str) -> tuple[dict, dict]:
    """(MUTANTS, CORRECT) of a sequence-parallel op: the bugs above; correct: the unreduced local norm declared
    as not reducing its gradients (the framework's job: the world adds them)."""
    mutants = {bug: _sequence(op, norm, bug) for bug in SEQUENCE_BUGS}
    local = Impl("local_grads", op, "the local norm, γ/β gradients left to the framework (reduces_grads no)",
                 f"tests.mutants.{op}:no_grad_reduction", follows={"reduces_grads": "no", **_RMS.get(norm, {})})
    return mutants, {"local_grads": local}


_RMS = {"rms_norm": {"weight_offset": 0.0, "casting": "end"}}


# ----------------------------------------------------------------------------- hidden-parallel
def _statistic(bug: str, partial: torch.Tensor, share: int, hidden_size: int, group) -> torch.Tensor:
    """A row's mean of `partial` (its per-rank sum) as the bug computes it."""
    if bug == "local_statistics":
        return partial / max(share, 1)  # this rank's slice only, no collective
    total = sum_over_ranks(partial, group)
    return total / max(share, 1) if bug == "divided_by_local_share" else total / hidden_size


class _EvenSplitWeight(torch.autograd.Function):
    """γ as a rank holding the whole of it would slice it, at rank·⌈H/W⌉ (an even split): forward gathers every
    rank's slice (padded to the largest) and takes that window; backward hands the gradient to its own slice."""

    @staticmethod
    def forward(ctx, weight, group, hidden_size):
        world, rank = collectives.world_size(group), collectives.rank(group)
        share = weight.shape[0]
        sizes = collectives.all_gather(torch.tensor([share], dtype=torch.float64), group).reshape(-1).long().tolist()
        padded = torch.zeros(max(sizes), dtype=weight.dtype, device=weight.device)
        padded[:share] = weight
        parts = collectives.all_gather(padded, group)
        whole = torch.cat([parts[r][:n] for r, n in enumerate(sizes)])
        start = min(rank * math.ceil(hidden_size / world), hidden_size - share)
        return whole[start:start + share].clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def _hidden(op: str, norm: str, bug: str):
    def normalised(input, normalized_shape, weight, bias, eps, group):
        dtype, hidden_size, share = compute_dtype(input), normalized_shape[-1], input.shape[-1]
        x = input.to(dtype)
        if norm == "layer_norm":
            centred = x - _statistic(bug, x.sum(-1, keepdim=True), share, hidden_size, group)
            y = centred * torch.rsqrt(_statistic(bug, (centred * centred).sum(-1, keepdim=True), share,
                                                 hidden_size, group) + eps)
        else:
            eps = torch.finfo(dtype).eps if eps is None else eps
            y = x * torch.rsqrt(_statistic(bug, (x * x).sum(-1, keepdim=True), share, hidden_size, group) + eps)
        if weight is not None:
            w = _EvenSplitWeight.apply(weight, group, hidden_size) if bug == "gamma_at_even_offset" else weight
            y = y * w.to(dtype)
        if bias is not None:
            y = y + bias.to(dtype)
        return y.to(input.dtype)

    if norm == "layer_norm":
        def fn(input, normalized_shape, weight, bias, eps, process_group, world_size, offset):
            return normalised(input, normalized_shape, weight, bias, eps, process_group)
    else:
        def fn(input, normalized_shape, weight, eps, process_group, world_size, offset):
            return normalised(input, normalized_shape, weight, None, eps, process_group)
    fn.__qualname__ = fn.__name__ = bug
    fn.__module__ = f"tests.mutants.{op}"  # (where the ranks load it from)
    return fn


HIDDEN_BUGS = ("local_statistics", "divided_by_local_share", "gamma_at_even_offset")


def hidden_catalogue(op: str, norm: str) -> tuple[dict, dict]:
    """(MUTANTS, CORRECT) of a hidden-parallel op; the correct one is the textbook (normcheck.kernels.parallel),
    judged by tests/test_impls.py."""
    return {bug: _hidden(op, norm, bug) for bug in HIDDEN_BUGS}, {}


# ----------------------------------------------------------------------------- residual add + norm, sequence-parallel
def _add_sequence(op: str, norm: str, bug: str):
    """h = its rows of x + residual, then the sequence-parallel norm: one of the reduction bugs above in the norm, or
    one of the stream's own: the residual added on rank 0 only (as a bias added once per tensor-parallel group
    would be), or h returned detached (its cotangent dh never reaches x and the residual)."""
    inner = _sequence(op, norm, bug) if bug in SEQUENCE_BUGS else None
    from normcheck.kernels.parallel import sequence

    def norm_of(h, normalized_shape, params, eps, group, world_size, offset):
        if inner is not None:
            return inner(h, normalized_shape, *params, eps, group, world_size, offset)
        textbook = sequence.layer_norm if norm == "layer_norm" else sequence.rms_norm
        return textbook(h, normalized_shape, *params, eps, group, world_size, offset)

    def fn(input, residual, normalized_shape, *rest):
        *params, eps, group, world_size, offset = rest
        h = input.to(residual.dtype)
        if bug != "residual_on_rank_0_only" or collectives.rank(group) == 0:
            h = h + residual
        y = norm_of(h, normalized_shape, params, eps, group, world_size, offset).to(input.dtype)
        return y, (h.detach() if bug == "stream_detached" else h)
    fn.__qualname__ = fn.__name__ = bug
    fn.__module__ = f"tests.mutants.{op}"  # (where the ranks load it from)
    return fn


ADD_SEQUENCE_BUGS = SEQUENCE_BUGS + ("residual_on_rank_0_only", "stream_detached")


def add_sequence_catalogue(op: str, norm: str) -> tuple[dict, dict]:
    """(MUTANTS, CORRECT) of a sequence-parallel add + norm: the bugs above; correct: the local norm of the local
    sum, its γ/β gradients left to the framework (reduces_grads no)."""
    mutants = {bug: _add_sequence(op, norm, bug) for bug in ADD_SEQUENCE_BUGS}
    local = Impl("local_grads", op, "x + residual, the local norm, γ/β gradients left to the framework "
                 "(reduces_grads no)", f"tests.mutants.{op}:no_grad_reduction",
                 follows={"reduces_grads": "no", **_RMS.get(norm, {})})
    return mutants, {"local_grads": local}
