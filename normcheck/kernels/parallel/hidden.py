"""Textbook hidden-parallel LayerNorm and RMSNorm: each rank holds a slice of every row; the row statistics are sums
over every rank's slice (all-reduced partial sums, divided by the WHOLE hidden size), then each rank normalises its
slice with its slice of γ and β. LayerNorm takes two passes (the mean, then Σ(x − mean)²), as a careful
single-device kernel would."""
from __future__ import annotations

import torch

from .reductions import compute_dtype, sum_over_ranks


def _eps(eps, dtype):
    return torch.finfo(dtype).eps if eps is None else eps


def layer_norm(input, normalized_shape, weight, bias, eps, process_group, world_size, offset):
    dtype, hidden = compute_dtype(input), normalized_shape[-1]
    x = input.to(dtype)
    mean = sum_over_ranks(x.sum(-1, keepdim=True), process_group) / hidden
    centred = x - mean
    var = sum_over_ranks((centred * centred).sum(-1, keepdim=True), process_group) / hidden
    y = centred * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y.to(input.dtype)


def rms_norm(input, normalized_shape, weight, eps, process_group, world_size, offset):
    dtype, hidden = compute_dtype(input), normalized_shape[-1]
    x = input.to(dtype)
    mean_square = sum_over_ranks((x * x).sum(-1, keepdim=True), process_group) / hidden
    y = x * torch.rsqrt(mean_square + _eps(eps, dtype))
    if weight is not None:
        y = y * weight.to(dtype)
    return y.to(input.dtype)
