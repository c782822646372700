"""Textbook sequence-parallel LayerNorm and RMSNorm: each rank normalises its own rows (the statistics of a row are
all on one rank) in float32 at least, and the replicated γ and β are wrapped so that backward all-reduces their
gradients in that precision (reduces_grads: every rank ends with the full sum, the same bits everywhere). The
residual add + norm adds its rows of the stream first (h stays sharded: elementwise, no collective)."""
from __future__ import annotations

import torch.nn.functional as F

from .reductions import compute_dtype, reduce_gradient


def _replicated(p, dtype, group):
    # cast first, then reduce: the partial sums travel in float32, rounded to γ's dtype once
    return None if p is None else reduce_gradient(p.to(dtype), group)


def layer_norm(input, normalized_shape, weight, bias, eps, process_group, world_size, offset):
    dtype = compute_dtype(input)
    y = F.layer_norm(input.to(dtype), normalized_shape, _replicated(weight, dtype, process_group),
                     _replicated(bias, dtype, process_group), eps)
    return y.to(input.dtype)


def rms_norm(input, normalized_shape, weight, eps, process_group, world_size, offset):
    dtype = compute_dtype(input)
    y = F.rms_norm(input.to(dtype), normalized_shape, _replicated(weight, dtype, process_group), eps)
    return y.to(input.dtype)


def _stream(input, residual):
    return input.to(residual.dtype) + residual  # (h in the residual stream's dtype)


def add_layer_norm(input, residual, normalized_shape, weight, bias, eps, process_group, world_size, offset):
    h = _stream(input, residual)
    return layer_norm(h, normalized_shape, weight, bias, eps, process_group, world_size, offset).to(input.dtype), h


def add_rms_norm(input, residual, normalized_shape, weight, eps, process_group, world_size, offset):
    h = _stream(input, residual)
    return rms_norm(h, normalized_shape, weight, eps, process_group, world_size, offset).to(input.dtype), h
