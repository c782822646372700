"""Gated LayerNorm (layernorm_gate: (LayerNorm(x)·w + b)·silu(z)) mutants and correct implementations, under the
contract fn(input, gate, normalized_shape, weight, bias, eps).

The bug classes of gated output-norm kernels: the bias added after the gate instead of before it, sigmoid where SiLU
is meant, SiLU's derivative taken as σ(z), the norm's backward fed the ungated dy, dgate taken of the normalised
value without the norm's affine part. Two correct styles: `composed` (F.layer_norm and silu through autograd in
float32 at least) and `fused` (one autograd.Function as a fused kernel is written, an explicit backward).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.ops.layernorm import TORCHS

from ._gated import _gate, _gate_grad  # (the same bug names: sigmoid_gate, silu_grad_as_sigmoid)
from ._records import test_code

BUGS = ("bias_after_gate", "sigmoid_gate", "silu_grad_as_sigmoid", "norm_grad_ungated", "dgate_without_affine")


class _GatedLayerNorm(torch.autograd.Function):
    """The norm, its affine part and the gate in the accumulation dtype, rows of the trailing `dims` dims; `bug`
    changes one step."""

    @staticmethod
    def forward(ctx, x, z, weight, bias, dims, eps, bug):
        acc = accumulation_dtype(x.dtype)
        hidden = prod(x.shape[x.dim() - dims:])
        xa, za = x.to(acc).reshape(-1, hidden), z.to(acc).reshape(-1, hidden)
        mean = xa.mean(dim=1, keepdim=True)
        rstd = torch.rsqrt((xa - mean).square().mean(dim=1, keepdim=True) + eps)
        xhat = (xa - mean) * rstd
        w = None if weight is None else weight.to(acc).reshape(1, hidden)
        b = None if bias is None else bias.to(acc).reshape(1, hidden)
        scaled = xhat if w is None else xhat * w
        y_norm = scaled if b is None or bug == "bias_after_gate" else scaled + b
        y = y_norm * _gate(za, bug)
        if b is not None and bug == "bias_after_gate":
            y = y + b
        ctx.save_for_backward(za, weight, bias, xhat, rstd, y_norm, scaled)
        ctx.bug, ctx.shapes = bug, (x.shape, x.dtype, z.dtype)
        return y.reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        za, weight, bias, xhat, rstd, y_norm, scaled = ctx.saved_tensors
        bug, (shape, x_dtype, z_dtype) = ctx.bug, ctx.shapes
        dya = dy.to(za.dtype).reshape(za.shape)
        gate = _gate(za, bug)
        d_norm = dya if bug == "norm_grad_ungated" else dya * gate
        g = d_norm if weight is None else d_norm * weight.to(za.dtype).reshape(1, -1)
        dx = rstd * (g - g.mean(dim=1, keepdim=True) - xhat * (g * xhat).mean(dim=1, keepdim=True))
        dz = dya * (scaled if bug == "dgate_without_affine" else y_norm) * _gate_grad(za, bug)
        dweight = None if weight is None else (d_norm * xhat).sum(dim=0).reshape(weight.shape).to(weight.dtype)
        dbias = None
        if bias is not None:
            dbias = (dya if bug == "bias_after_gate" else d_norm).sum(dim=0).reshape(bias.shape).to(bias.dtype)
        return dx.reshape(shape).to(x_dtype), dz.reshape(shape).to(z_dtype), dweight, dbias, None, None, None


def fused(bug: str | None = None):
    def gated_layer_norm(input, gate, normalized_shape, weight=None, bias=None, eps=1e-5):
        return _GatedLayerNorm.apply(input, gate, weight, bias, len(normalized_shape), eps, bug)
    gated_layer_norm.__qualname__ = bug or "fused"
    return gated_layer_norm


def composed(input, gate, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm and silu through autograd, in float32 at least."""
    acc = accumulation_dtype(input.dtype)
    w = None if weight is None else weight.to(acc)
    b = None if bias is None else bias.to(acc)
    y = torch.nn.functional.layer_norm(input.to(acc), normalized_shape, w, b, eps)
    return (y * torch.nn.functional.silu(gate.to(acc))).to(input.dtype)


def _record(name, fn, what):
    return test_code("layernorm_gate", name, fn, what, TORCHS)


MUTANTS = {bug: _record(bug, fused(bug), f"mutant: {bug}") for bug in BUGS}
CORRECT = {"composed": _record("composed", composed, "F.layer_norm and silu through autograd, float32 inside"),
           "fused": _record("fused", fused(), "one autograd.Function, float32 inside")}
globals().update(MUTANTS | CORRECT)
