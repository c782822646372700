"""Norms that are right to rounding but not batch invariant: their reduction order depends on the number of rows, as
kernels that pick a block size, a split of the reduction or a persistent schedule from the batch do. The default
sweep passes them; `--check batch-invariance` fails them (tests/test_batch_invariance.py)."""
from __future__ import annotations

import math

import torch


def _rows_and_flat(input, normalized_shape):
    size = math.prod(normalized_shape)
    return input.numel() // max(size, 1), input.reshape(-1, size)


def _compute(input):
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _affine(y, weight, bias, input, normalized_shape):
    y = y.reshape(input.shape)
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(input.dtype)


def reversed_sums_from_64_rows(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """LayerNorm whose row sums run backwards once the batch has 64 rows or more (another block schedule)."""
    rows, flat = _rows_and_flat(input, normalized_shape)
    x = flat.to(_compute(input))
    order = (lambda t: t.flip(-1)) if rows >= 64 else (lambda t: t)
    mean = order(x).sum(-1, keepdim=True) / x.shape[-1]
    centred = x - mean
    var = order(centred * centred).sum(-1, keepdim=True) / x.shape[-1]
    return _affine(centred * torch.rsqrt(var + eps), weight, bias, input, normalized_shape)


def split_k_below_16_rows(input, normalized_shape, weight=None, eps=None):
    """RMSNorm that splits each row's Σx² in two halves when the batch has fewer than 16 rows (split-K, to fill the
    machine when there are few rows), one sum otherwise."""
    rows, flat = _rows_and_flat(input, normalized_shape)
    x = flat.to(_compute(input))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    squares = x * x
    if rows < 16:
        half = x.shape[-1] // 2
        total = squares[:, :half].sum(-1, keepdim=True) + squares[:, half:].sum(-1, keepdim=True)
    else:
        total = squares.sum(-1, keepdim=True)
    return _affine(x * torch.rsqrt(total / x.shape[-1] + eps), weight, None, input, normalized_shape)
