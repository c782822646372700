"""Gated RMSNorm mutants and correct implementations, under the contract fn(input, gate, normalized_shape, weight,
eps), the gate before the norm (gate_rmsnorm: RMSNorm(x·silu(z))·w) or after it (rmsnorm_gate: RMSNorm(x)·w·silu(z)).

The bug classes of gated-norm kernels (Mamba2's and fused linear-attention kernels'): the gate on the wrong side of
the norm, sigmoid where SiLU is meant, SiLU's derivative taken as σ(z) alone, the gate left out of dx (before) or out
of the gradient the norm receives (after), the statistics of the ungated x normalising the gated one, dgate taken of
x instead of the normalised output.

Two correct styles: `composed` (the textbook RMSNorm of tests/mutants/rmsnorm.py with the gate through autograd)
and `fused` (one autograd.Function as a fused kernel is written: the gate, the row statistics and the product in
float32, an explicit backward).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.ops import Impl, rmsnorm

from .rmsnorm import textbook

BEFORE_BUGS = ("gate_after_norm", "sigmoid_gate", "silu_grad_as_sigmoid", "dx_ungated", "stats_of_ungated_x")
AFTER_BUGS = ("gate_before_norm", "sigmoid_gate", "silu_grad_as_sigmoid", "norm_grad_ungated", "dgate_of_x")


def _default_eps(dtype):
    return rmsnorm.default_eps({torch.float64: "f64"}.get(dtype, "f32"))


def _gate(z, bug):
    return torch.sigmoid(z) if bug == "sigmoid_gate" else torch.nn.functional.silu(z)


def _gate_grad(z, bug):
    s = torch.sigmoid(z)
    return s if bug == "silu_grad_as_sigmoid" else s * (1 + z * (1 - s))


class _GatedRMSNorm(torch.autograd.Function):
    """The gated norm in the accumulation dtype with an explicit backward; `first`: the gate before the norm.
    `bug` changes one step."""

    @staticmethod
    def forward(ctx, x, z, weight, dims, eps, first, bug):
        acc = accumulation_dtype(x.dtype)
        xa, za = x.to(acc), z.to(acc)
        eps = _default_eps(x.dtype) if eps is None else eps
        gate_first = first != (bug in ("gate_after_norm", "gate_before_norm"))
        gate = _gate(za, bug)
        u = xa * gate if gate_first else xa
        rows = prod(x.shape[: x.dim() - dims])
        of = (xa if bug == "stats_of_ungated_x" else u).reshape(rows, -1)
        rstd = torch.rsqrt(of.square().mean(dim=1, keepdim=True) + eps)
        xhat = u.reshape(rows, -1) * rstd
        y_norm = xhat * weight.to(acc).reshape(1, -1) if weight is not None else xhat
        y = y_norm if gate_first else y_norm * gate.reshape(rows, -1)
        ctx.save_for_backward(xa, za, weight, xhat, rstd, y_norm)
        ctx.gate_first, ctx.bug, ctx.dtypes = gate_first, bug, (x.dtype, z.dtype)
        return y.reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xa, za, weight, xhat, rstd, y_norm = ctx.saved_tensors
        bug, rows = ctx.bug, xhat.shape[0]
        gate, slope = _gate(za, bug).reshape(rows, -1), _gate_grad(za, bug).reshape(rows, -1)
        dya = dy.to(xa.dtype).reshape(rows, -1)
        d_norm = dya if ctx.gate_first or bug == "norm_grad_ungated" else dya * gate
        g = d_norm * weight.to(xa.dtype).reshape(1, -1) if weight is not None else d_norm
        du = rstd * (g - xhat * (g * xhat).mean(dim=1, keepdim=True))
        x = xa.reshape(rows, -1)
        if ctx.gate_first:
            dx = du if bug == "dx_ungated" else du * gate
            dz = du * x * slope
        else:
            dx = du
            dz = dya * (x if bug == "dgate_of_x" else y_norm) * slope
        dweight = None if weight is None else (d_norm * xhat).sum(dim=0).reshape(weight.shape).to(weight.dtype)
        x_dtype, z_dtype = ctx.dtypes
        return dx.reshape(xa.shape).to(x_dtype), dz.reshape(za.shape).to(z_dtype), dweight, None, None, None, None


def fused(first: bool, bug: str | None = None):
    def gated_rms_norm(input, gate, normalized_shape, weight=None, eps=None):
        return _GatedRMSNorm.apply(input, gate, weight, len(normalized_shape), eps, first, bug)
    gated_rms_norm.__qualname__ = bug or "fused"
    return gated_rms_norm


def composed(first: bool):
    """The textbook RMSNorm with the gate through autograd, in float32 at least."""
    def composed(input, gate, normalized_shape, weight=None, eps=None):
        acc = accumulation_dtype(input.dtype)
        eps = _default_eps(input.dtype) if eps is None else eps
        x, silu = input.to(acc), torch.nn.functional.silu(gate.to(acc))
        w = None if weight is None else weight.to(acc)
        if first:
            return textbook(x * silu, normalized_shape, w, eps).to(input.dtype)
        return (textbook(x, normalized_shape, w, eps) * silu).to(input.dtype)
    return composed


def catalogue(first: bool) -> tuple[dict, dict]:
    """(MUTANTS, CORRECT) of the gate before (first) or after the norm, each following torch's RMSNorm conventions
    (the weight as given, rounded once at the end)."""
    op = "gate_rmsnorm" if first else "rmsnorm_gate"

    def record(name, fn, what):
        fn.__qualname__ = name
        return Impl(name, op, what, fn, follows=rmsnorm.TORCHS, capabilities="unknown (test code)")

    return ({bug: record(bug, fused(first, bug), f"mutant: {bug}") for bug in (BEFORE_BUGS if first else AFTER_BUGS)},
            {"composed": record("composed", composed(first), "textbook RMSNorm, the gate through autograd"),
             "fused": record("fused", fused(first), "one autograd.Function, float32 inside")})
