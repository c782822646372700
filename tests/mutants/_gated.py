"""Gated RMSNorm mutants and correct implementations, under the contract fn(input, gate, normalized_shape, weight,
eps, group_size=None), the gate before the norm (gate_rmsnorm: RMSNorm(x·silu(z))·w) or after it (rmsnorm_gate:
RMSNorm(x)·w·silu(z)).

The bug classes of gated-norm kernels (Mamba2's and fused linear-attention kernels'): the gate on the wrong side of
the norm, sigmoid where SiLU is meant, SiLU's derivative taken as σ(z) alone, the gate left out of dx (before) or out
of the gradient the norm receives (after), the statistics of the ungated x normalising the gated one, dgate taken of
x instead of the normalised output.

Each takes group_size (statistics per group of the row, tests/mutants/grouped_rmsnorm.py). Two correct styles:
`composed` (the textbook RMSNorm of tests/mutants/rmsnorm.py on each group, the gate through autograd) and `fused`
(one autograd.Function as a fused kernel is written: the gate, the group statistics and the product in float32, an
explicit backward).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.ops import rmsnorm

from ._records import test_code
from .grouped_rmsnorm import composed_norm, default_eps, grouped

BEFORE_BUGS = ("gate_after_norm", "sigmoid_gate", "silu_grad_as_sigmoid", "dx_ungated", "stats_of_ungated_x")
AFTER_BUGS = ("gate_before_norm", "sigmoid_gate", "silu_grad_as_sigmoid", "norm_grad_ungated", "dgate_of_x")


def _gate(z, bug):
    return torch.sigmoid(z) if bug == "sigmoid_gate" else torch.nn.functional.silu(z)


def _gate_grad(z, bug):
    s = torch.sigmoid(z)
    return s if bug == "silu_grad_as_sigmoid" else s * (1 + z * (1 - s))


class _GatedRMSNorm(torch.autograd.Function):
    """The gated norm in the accumulation dtype with an explicit backward; `first`: the gate before the norm; the
    statistics per group of `group_size` values of the row (None: the whole row). `bug` changes one step."""

    @staticmethod
    def forward(ctx, x, z, weight, dims, eps, first, bug, group_size):
        acc = accumulation_dtype(x.dtype)
        xa, za = x.to(acc), z.to(acc)
        eps = default_eps(x.dtype) if eps is None else eps
        gate_first = first != (bug in ("gate_after_norm", "gate_before_norm"))
        rows, hidden = prod(x.shape[: x.dim() - dims]), prod(x.shape[x.dim() - dims:])

        def by_group(a):  # (rows, G, group)
            return grouped(a, rows, hidden, group_size)

        gate = by_group(_gate(za, bug))
        u = by_group(xa) * gate if gate_first else by_group(xa)
        of = by_group(xa) if bug == "stats_of_ungated_x" else u
        rstd = torch.rsqrt(of.square().mean(dim=2, keepdim=True) + eps)
        xhat = u * rstd
        w = None if weight is None else grouped(weight.to(acc), 1, hidden, group_size)
        y_norm = xhat if w is None else xhat * w
        y = y_norm if gate_first else y_norm * gate
        ctx.save_for_backward(xa, za, weight, xhat, rstd, y_norm)
        ctx.gate_first, ctx.bug, ctx.dtypes, ctx.groups = gate_first, bug, (x.dtype, z.dtype), (rows, hidden, group_size)
        return y.reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xa, za, weight, xhat, rstd, y_norm = ctx.saved_tensors
        bug, (rows, hidden, group_size) = ctx.bug, ctx.groups

        def by_group(a):
            return grouped(a, rows, hidden, group_size)

        gate, slope = by_group(_gate(za, bug)), by_group(_gate_grad(za, bug))
        dya = by_group(dy.to(xa.dtype))
        d_norm = dya if ctx.gate_first or bug == "norm_grad_ungated" else dya * gate
        w = None if weight is None else grouped(weight.to(xa.dtype), 1, hidden, group_size)
        g = d_norm * w if w is not None else d_norm
        du = rstd * (g - xhat * (g * xhat).mean(dim=2, keepdim=True))
        x = by_group(xa)
        if ctx.gate_first:
            dx = du if bug == "dx_ungated" else du * gate
            dz = du * x * slope
        else:
            dx = du
            dz = dya * (x if bug == "dgate_of_x" else y_norm) * slope
        dweight = None if weight is None else (d_norm * xhat).sum(dim=0).reshape(weight.shape).to(weight.dtype)
        x_dtype, z_dtype = ctx.dtypes
        return (dx.reshape(xa.shape).to(x_dtype), dz.reshape(za.shape).to(z_dtype), dweight, None, None, None, None,
                None)


def fused(first: bool, bug: str | None = None):
    def gated_rms_norm(input, gate, normalized_shape, weight=None, eps=None, group_size=None):
        return _GatedRMSNorm.apply(input, gate, weight, len(normalized_shape), eps, first, bug, group_size)
    gated_rms_norm.__qualname__ = bug or "fused"
    return gated_rms_norm


def composed(first: bool):
    """The textbook RMSNorm (of each group) with the gate through autograd, in float32 at least."""
    def composed(input, gate, normalized_shape, weight=None, eps=None, group_size=None):
        acc = accumulation_dtype(input.dtype)
        eps = default_eps(input.dtype) if eps is None else eps
        x, silu = input.to(acc), torch.nn.functional.silu(gate.to(acc))
        w = None if weight is None else weight.to(acc)
        if first:
            return composed_norm(x * silu, normalized_shape, w, eps, group_size).to(input.dtype)
        return (composed_norm(x, normalized_shape, w, eps, group_size) * silu).to(input.dtype)
    return composed


def catalogue(first: bool) -> tuple[dict, dict]:
    """(MUTANTS, CORRECT) of the gate before (first) or after the norm, each following torch's RMSNorm conventions
    (the weight as given, rounded once at the end)."""
    op = "gate_rmsnorm" if first else "rmsnorm_gate"

    def record(name, fn, what):
        return test_code(op, name, fn, what, rmsnorm.TORCHS)

    return ({bug: record(bug, fused(first, bug), f"mutant: {bug}") for bug in (BEFORE_BUGS if first else AFTER_BUGS)},
            {"composed": record("composed", composed(first), "textbook RMSNorm, the gate through autograd"),
             "fused": record("fused", fused(first), "one autograd.Function, float32 inside")})
