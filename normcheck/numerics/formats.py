"""Memory formats: how a case lays x and dy out in memory (the names; frameworks lay tensors out).

A kernel that reads strides wrongly is right on contiguous tensors and wrong on everything else,
so every case names a format for x and (independently) for dy.
"""
from __future__ import annotations

from ..core.errors import UsageError

FORMATS = ("contiguous", "channels_last", "channels_last_3d", "strided")

# The formats that exist for one rank only.
FORMAT_RANK = {"channels_last": 4, "channels_last_3d": 5}


def check_format(name: str, ndim: int) -> None:
    if name not in FORMATS:
        raise UsageError(f"unknown memory format {name!r}; choose one of {', '.join(FORMATS)}")
    rank = FORMAT_RANK.get(name)
    if rank is not None and ndim != rank:
        raise UsageError(f"memory format {name} needs a {rank}-D input, got a {ndim}-D shape")


def formats_for(rank: int) -> list[str]:
    """The formats an input of `rank` dimensions can take."""
    return [f for f in FORMATS if FORMAT_RANK.get(f, rank) == rank]
