"""Memory formats: how a case lays x and dy out in memory (the names; frameworks lay tensors out).

A kernel that reads strides wrongly is right on contiguous tensors and wrong on everything else,
so every case names a format for x and (independently) for dy:
  contiguous, channels_last, channels_last_3d   the standard ones
  strided      a genuine non-dense view (every other element, channel axis outermost)
  transposed   dense, with the last two dims swapped in memory (the innermost dim is not unit-stride)
  sliced       contiguous strides at a storage offset (a kernel indexing from the storage's start reads
               the wrong elements)
  offset8, offset4
               contiguous strides at a storage offset that leaves the data pointer 8 (4) bytes past a 16-byte
               boundary (storage starts 64-byte aligned): kernels choose their vector width from the pointer's
               alignment (16 bytes: 4 floats or 8 halves; 8; 4), so each class is a path of its own. The offset is
               that many bytes' worth of elements, at least one (an f64 tensor has no 4-byte class: offset4 is 8)
  pitched      rows at a pitch: the innermost dim unit-stride, the rows PITCH times their length apart, as the
               q of a fused projection (qkv[..., :d]) or padded rows are: kernels that take the row stride to be
               the row length, or lay an output out by an input's strides
  expanded     dy only: stride 0 along the batch, as autograd hands over the gradient of y.sum() or
               of a broadcast loss (dy's values are then the same for every sample)
  contiguous_size1, channels_last_size1
               the base format (contiguous, channels_last) with every size-1 dim at a non-canonical stride: no
               step is ever taken along such a dim, so its stride is whatever the view that made the tensor chose
               (unsqueeze, a reshape that keeps a view, a transposed single row); a kernel that classifies the
               layout from strides (channels-last? contiguous? which dim is innermost?) without ignoring size-1
               dims reads it as another layout. The stride is 1 (2 where 1 is canonical): below the canonical one,
               where stride heuristics read a dim as inner (torch's suggest_memory_format as contiguous). A case
               without a size-1 dim has its base layout exactly
"""
from __future__ import annotations

from ..core.errors import UsageError

FORMATS = ("contiguous", "channels_last", "channels_last_3d", "strided", "transposed", "sliced", "offset8", "offset4",
           "pitched", "expanded", "contiguous_size1", "channels_last_size1")
DY_ONLY = ("expanded",)  # an expanded x would make several elements one

# The bytes past a 16-byte boundary that each offset format leaves the data pointer at
OFFSET_BYTES = {"offset8": 8, "offset4": 4}
SLICE_OFFSET = 3  # sliced's elements: odd, so the pointer is aligned to no more than its element size
PITCH = 3  # pitched rows lie three row lengths apart (qkv[..., :d])

# The formats that exist for one rank only.
FORMAT_RANK = {"channels_last": 4, "channels_last_3d": 5, "channels_last_size1": 4}

CHANNELS_LAST = ("channels_last", "channels_last_3d")  # the standard channels-last formats
NON_DENSE = ("strided", "transposed", "pitched")  # in no standard memory format: kernels' slow (or refusing) paths

# The formats whose size-1 dims take non-canonical strides, and the standard format each is otherwise
SIZE1_BASE = {"contiguous_size1": "contiguous", "channels_last_size1": "channels_last"}


def storage_offset(name: str, itemsize: int) -> int:
    """The storage offset, in elements, a format lays a tensor out at (0: none)."""
    if name == "sliced":
        return SLICE_OFFSET
    return max(1, OFFSET_BYTES[name] // itemsize) if name in OFFSET_BYTES else 0


def base_format(name: str) -> str:
    """The standard format `name` lays the elements out in (itself, but for the size-1 formats')."""
    return SIZE1_BASE.get(name, name)


def innermost_dim(name: str, ndim: int) -> int:
    """The dim a tensor of `ndim` dims laid out as `name` steps through first in memory (where a kernel's vector lanes
    run): the channels of a channels-last format, the second-last of a transposed one, else the last."""
    base = base_format(name)
    return 1 if base in CHANNELS_LAST else ndim - 2 if base == "transposed" and ndim > 1 else ndim - 1


def effective_format(name: str, shape: tuple[int, ...]) -> str:
    """The format a tensor of `shape` laid out as `name` has: a size-1 format's base where the shape has no size-1 dim
    (its strides are then the base's exactly), else `name`. Known issues of a standard format's kernels read this."""
    return SIZE1_BASE[name] if name in SIZE1_BASE and 1 not in shape else name


def standard_channels_last(name: str, shape: tuple[int, ...]) -> bool:
    """A tensor of `shape` laid out as `name` has a standard channels-last layout (strides included): what the known
    issues of torch's channels-last kernels apply to."""
    return effective_format(name, shape) in CHANNELS_LAST


def size1_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """`strides` with the stride of every size-1 dim made non-canonical: 1, or 2 where it is 1 (the memory the other
    dims span is the same: no step is taken along a size-1 dim)."""
    return tuple((2 if stride == 1 else 1) if size == 1 else stride for size, stride in zip(shape, strides))


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
