"""Memory formats: how a case lays x and dy out in memory.

A kernel that reads strides wrongly is right on contiguous tensors and wrong on everything else,
so every case names a format for x and (independently) for dy.
"""
from __future__ import annotations

import torch

from .errors import UsageError

FORMATS = ("contiguous", "channels_last", "channels_last_3d", "strided")

_FORMAT_RANK = {"channels_last": 4, "channels_last_3d": 5}


def check_format(name: str, ndim: int) -> None:
    if name not in FORMATS:
        raise UsageError(f"unknown memory format {name!r}; choose one of {', '.join(FORMATS)}")
    rank = _FORMAT_RANK.get(name)
    if rank is not None and ndim != rank:
        raise UsageError(f"memory format {name} needs a {rank}-D input, got a {ndim}-D shape")


def lay_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """Return a tensor equal to contiguous `t` in the named layout (fresh storage, never aliases t)."""
    if name == "contiguous":
        return t.clone(memory_format=torch.contiguous_format)
    if name == "channels_last":
        return t.clone(memory_format=torch.channels_last)
    if name == "channels_last_3d":
        return t.clone(memory_format=torch.channels_last_3d)
    if name == "strided":
        # A genuine non-contiguous view: every other element of a buffer twice as wide in the last
        # dimension, with the channel axis moved outermost so no stride matches a standard format.
        wide = list(t.shape)
        wide[-1] *= 2
        perm = [1, 0] + list(range(2, t.dim()))
        buffer = torch.zeros([wide[i] for i in perm], dtype=t.dtype).permute(*_inverse(perm))
        view = buffer[..., ::2]
        view.copy_(t)
        return view
    raise UsageError(f"unknown memory format {name!r}; choose one of {', '.join(FORMATS)}")


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def describe(t: torch.Tensor) -> str:
    """Name the layout a tensor actually has (for messages)."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "channels_last_3d"
    return f"strides {tuple(t.stride())}"
