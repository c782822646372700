"""Memory formats: how a case lays x and dy out in memory (the names; frameworks lay tensors out).

A kernel that reads strides wrongly is right on contiguous tensors and wrong on everything else,
so every case names a format for x and (independently) for dy:
  contiguous, channels_last, channels_last_3d   the standard ones
  strided      a genuine non-dense view (every other element, channel axis outermost)
  transposed   dense, with the last two dims swapped in memory (the innermost dim is not unit-stride)
  sliced       contiguous strides at a storage offset (a kernel indexing from the storage's start reads
               the wrong elements)
  expanded     dy only: stride 0 along the batch, as autograd hands over the gradient of y.sum() or
               of a broadcast loss (dy's values are then the same for every sample)
"""
from __future__ import annotations

from ..core.errors import UsageError

FORMATS = ("contiguous", "channels_last", "channels_last_3d", "strided", "transposed", "sliced", "expanded")
DY_ONLY = ("expanded",)  # an expanded x would make several elements one

# The formats that exist for one rank only.
FORMAT_RANK = {"channels_last": 4, "channels_last_3d": 5}


def check_format(name: str, ndim: int, tensor: str = "x") -> None:
    if name not in FORMATS:
        raise UsageError(f"unknown memory format {name!r}; choose one of {', '.join(FORMATS)}")
    if name in DY_ONLY and tensor != "dy":
        raise UsageError(f"memory format {name} applies to dy only (give it as --memory-format X:{name})")
    rank = FORMAT_RANK.get(name)
    if rank is not None and ndim != rank:
        raise UsageError(f"memory format {name} needs a {rank}-D input, got a {ndim}-D shape")


def formats_for(rank: int, tensor: str = "x") -> list[str]:
    """The formats `tensor` ("x" or "dy") of `rank` dimensions can take."""
    return [f for f in FORMATS if FORMAT_RANK.get(f, rank) == rank and (tensor == "dy" or f not in DY_ONLY)]


def expressible(formats: tuple[str, ...] | None, x_format: str, dy_format: str) -> bool:
    """x and dy can be laid out as asked by code that expresses only `formats`, one for both (None: any)."""
    return formats is None or (x_format in formats and dy_format == x_format)
