"""Fused GroupNorm + SiLU mutants and correct implementations (F.group_norm's signature, returning SiLU(GN(x))):
the SiLU factor left out of the backward, SiLU's derivative taken as σ(y) alone, σ evaluated at the input instead
of the norm's output, SiLU applied before the norm.

Two correct styles: the textbook GroupNorm (tests/mutants/textbook.py) composed with F.silu, and one
autograd.Function with SiLU's backward written out (recomputed from y in float32, as fused kernels do).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from normcheck.frameworks.torch import accumulation_dtype

from .textbook import group_norm


class _FusedSiLU(torch.autograd.Function):
    """z = SiLU(y) with an explicit backward; `bug` changes the derivative it applies."""

    @staticmethod
    def forward(ctx, y, x, bug):
        ctx.save_for_backward(y, x)
        ctx.bug = bug
        acc = accumulation_dtype(y.dtype)
        return F.silu(y.to(acc)).to(y.dtype)

    @staticmethod
    def backward(ctx, dz):
        y, x = ctx.saved_tensors
        acc = accumulation_dtype(y.dtype)
        at = (x if ctx.bug == "sigma_of_input" else y).to(acc)
        s = torch.sigmoid(at)
        grad = s if ctx.bug == "sigma_only" else s * (1 + at * (1 - s))
        if ctx.bug == "silu_backward_skipped":
            grad = torch.ones_like(grad)
        return (dz.to(acc) * grad).to(y.dtype), None, None


def _fused(bug: str | None = None):
    norm = group_norm()

    def group_norm_silu(input, num_groups, weight=None, bias=None, eps=1e-5):
        if bug == "silu_before_norm":
            return norm(F.silu(input), num_groups, weight, bias, eps)
        return _FusedSiLU.apply(norm(input, num_groups, weight, bias, eps), input.detach(), bug)
    group_norm_silu.__qualname__ = bug or "fused"
    return group_norm_silu


def composed(input, num_groups, weight=None, bias=None, eps=1e-5):
    return F.silu(group_norm()(input, num_groups, weight, bias, eps))


BUGS = ("silu_backward_skipped", "sigma_only", "sigma_of_input", "silu_before_norm")
MUTANTS = {bug: _fused(bug) for bug in BUGS}
CORRECT = {"composed": composed, "fused": _fused()}
globals().update(MUTANTS | CORRECT)
