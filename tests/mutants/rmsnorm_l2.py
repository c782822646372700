"""Mutants and correct implementations of RMSNorm written with F.normalize, under the contract fn(input,
normalized_shape, weight, eps): F.normalize(input, eps) · √H · weight over the last K dims (the norm floored at eps).

The bug classes of such layers: eps added to the mean of squares (F.rms_norm's rsqrt(ms + eps)), the floor put on the
RMS instead of the norm (max(rms, eps), mmpose's ScaleNorm: a floor √H times too high), the √H left out (the
lucidrains l2norm's output), the norm treated as a constant (x / norm.detach()), the sum of squares accumulated in
half precision.

Two correct styles: `normalize` (F.normalize through autograd, float32 inside) and `clamped` (x / vector_norm(x)
.clamp(min=eps) · √H, the floor written out).
"""
from __future__ import annotations

from math import prod

import torch
import torch.nn.functional as F

from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code

BUGS = ("eps_added", "floor_on_rms", "without_sqrt_h", "detached_norm", "half_statistic")


def clamped(input, normalized_shape, weight=None, eps=1e-12, bug=None):
    """x / vector_norm(x).clamp(min=eps) · √H · w through autograd, float32 inside (`bug`: how it goes wrong)."""
    x = input.to(accumulation_dtype(input.dtype))
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    h = prod(normalized_shape)
    if bug == "half_statistic":
        norm = x.to(torch.float16).pow(2).sum(dims, keepdim=True).to(x.dtype).sqrt()
    else:
        norm = torch.linalg.vector_norm(x, dim=dims, keepdim=True)
    if bug == "eps_added":
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    elif bug == "floor_on_rms":
        y = x / (norm / h ** 0.5).clamp(min=eps)
    else:
        y = x / (norm.detach() if bug == "detached_norm" else norm).clamp(min=eps)
        y = y if bug == "without_sqrt_h" else y * h ** 0.5
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


def normalize(input, normalized_shape, weight=None, eps=1e-12):
    """F.normalize over the flattened rows · √H · w, float32 inside."""
    x = input.to(accumulation_dtype(input.dtype))
    rows = x.flatten(x.dim() - len(normalized_shape))
    y = (F.normalize(rows, dim=-1, eps=eps) * rows.shape[-1] ** 0.5).reshape(x.shape)
    return (y if weight is None else y * weight.to(x.dtype)).to(input.dtype)


def _mutant(bug):
    def fn(input, normalized_shape, weight=None, eps=1e-12):
        return clamped(input, normalized_shape, weight, eps, bug=bug)
    fn.__qualname__ = bug
    return fn


def _record(name, fn, what):
    return test_code("rmsnorm_l2", name, fn, what, {"weight_offset": 0.0})  # (they scale by w, as torch's record)


MUTANTS = {bug: _record(bug, _mutant(bug), f"mutant: {bug}") for bug in BUGS}
CORRECT = {"normalize": _record("normalize", normalize, "F.normalize through autograd, float32 inside"),
           "clamped": _record("clamped", clamped, "vector_norm(x).clamp(min=eps) · √H through autograd")}
globals().update(MUTANTS | CORRECT)
