"""Adaptive GroupNorm + SiLU mutants and correct implementations, under the adagn_silu contract
fn(input, scale, shift, num_groups, weight, bias, eps) -> SiLU(GroupNorm(input)·(1 + scale) + shift).

The bug classes of a fused modulation and epilogue: SiLU applied before the modulation, SiLU's derivative taken at
the norm's output (the register the modulation read) instead of the modulated value, the modulation's gradients taken
from the incoming gradient without SiLU's derivative, and SiLU's backward skipped altogether.

Two correct styles: `composed` (the catalogue's adagn textbook, then F.silu in the accumulation dtype, through
autograd) and `fused` (adagn's fused kernel followed by SiLU's, each an autograd.Function with its backward written
out, as two fused kernels are chained).
"""
from __future__ import annotations

import torch.nn.functional as F

from normcheck.frameworks.torch import accumulation_dtype

from .adagn import _over_spatial
from .adagn import CORRECT as ADAGN
from .groupnorm_silu import _FusedSiLU
from .textbook import group_norm

_textbook = group_norm()


def _silu(v):
    return F.silu(v.to(accumulation_dtype(v.dtype))).to(v.dtype)


def composed(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    return _silu(ADAGN["composed"](input, scale, shift, num_groups, weight, bias, eps))


def fused(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    v = ADAGN["fused"](input, scale, shift, num_groups, weight, bias, eps)
    return _FusedSiLU.apply(v, v, None)


def silu_before_modulation(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    y = _silu(_textbook(input.contiguous(), num_groups, weight, bias, eps))
    return y * (1 + _over_spatial(scale, input)) + _over_spatial(shift, input)


def silu_grad_at_norm(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    y_norm = _textbook(input.contiguous(), num_groups, weight, bias, eps)
    v = y_norm * (1 + _over_spatial(scale, input)) + _over_spatial(shift, input)
    return _FusedSiLU.apply(v, y_norm, "sigma_of_input")  # (σ evaluated at its second argument)


def modulation_grads_without_silu(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    """dx through SiLU's derivative, dscale = Σ dy·ŷ and dshift = Σ dy without it."""
    y_norm = _textbook(input.contiguous(), num_groups, weight, bias, eps)
    s, sh = _over_spatial(scale, input), _over_spatial(shift, input)
    z = _silu(y_norm * (1 + s.detach()) + sh.detach())
    wrong = y_norm.detach() * s + sh  # (0 in the forward: its gradient is the modulation's without SiLU's)
    return z + (wrong - wrong.detach())


def silu_backward_skipped(input, scale, shift, num_groups, weight=None, bias=None, eps=1e-5):
    v = ADAGN["composed"](input, scale, shift, num_groups, weight, bias, eps)
    return _FusedSiLU.apply(v, v, "silu_backward_skipped")


MUTANTS = {f.__name__: f for f in (silu_before_modulation, silu_grad_at_norm, modulation_grads_without_silu,
                                   silu_backward_skipped)}
CORRECT = {"composed": composed, "fused": fused}
