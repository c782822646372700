"""Pieces shared by the BatchNorm and GroupNorm references.

* :class:`NormBackward`, the result of both backward functions;
* input conversion and validation (one-line ``ValueError`` messages);
* how the work is split into cache-sized groups, and the group reductions.

Why groups
----------
Each reference function makes several passes over its input: the mean, then the squared
deviations (two-pass statistics), then the output.  Written as whole-array NumPy expressions,
every pass streams the full input from main memory again, plus full-size temporaries such as
``x - mean``.  The functions therefore walk the array in *groups of whole normalisation sets*
(BatchNorm: a few channels over the whole batch; GroupNorm: a few (n, group) rows) of about
``GROUP_ELEMS`` elements: the textbook formulas run unchanged on one group at a time, the
group stays in cache between its passes, and memory traffic is essentially reading the inputs
once and writing the outputs once.  Because a group holds whole sets, every statistic is still
an exact two-pass one; grouping changes nothing but the order of the loop over sets.

Two NumPy details matter for speed and are handled here:

* an elementwise op with a per-channel constant broadcast along a long inner axis, e.g.
  ``d * scale[:, None]``, runs about 2x slower than the same op between two arrays;
  :func:`channel_rows` therefore expands per-channel constants to ``(channels, S)`` rows once
  per group (they are reused over the whole batch);
* plain sums use ``np.einsum`` (SIMD with several accumulators; 1.5x faster than
  ``np.add.reduce`` on long rows and up to 10x on rows of a few elements); sums of products
  use ``np.vecdot`` (BLAS dot) on long rows, where it is 2x faster than einsum, and einsum on
  short ones.  All accumulate in float64.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

__all__ = ["NormBackward", "working", "working_precision"]

# The precision the reference computes in: float64, except where the same-precision baseline evaluates this
# very math in a case's accumulation precision (engine.baseline), so the two cannot disagree about an op.
_WORKING: ContextVar[type] = ContextVar("working", default=np.float64)


def working() -> type:
    """The NumPy dtype the reference computes in now (float64 unless inside `working_precision`)."""
    return _WORKING.get()


@contextmanager
def working_precision(dtype):
    """Evaluate the reference in `dtype` (np.float32: a float32 kernel's arithmetic) for the block."""
    token = _WORKING.set(np.dtype(dtype).type)
    try:
        yield
    finally:
        _WORKING.reset(token)

#: Elements (float64) per group of normalisation sets: 4 MiB, so the input group, the output
#: group and one temporary stay in the last-level cache while a group is processed.  (Tuned
#: on a 1 MiB-L2 / 32 MiB-L3 core: 2-8 MiB are within ~10% of each other; GroupNorm, whose
#: groups are contiguous, does best with half of it.)
GROUP_ELEMS = 1 << 19

# Contiguous run (elements) below which sums of products use einsum instead of vecdot.
_SHORT_RUN = 64

#: A BatchNorm group takes at least this many elements of each sample (whole channels), so a
#: group is not a strided gather of tiny runs when the spatial size is small.
MIN_RUN = 512

_vecdot = getattr(np, "vecdot", None)  # NumPy >= 2.0
if _vecdot is None:  # pragma: no cover - NumPy 1.x

    def _vecdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.einsum("...r,...r->...", a, b)


@dataclass(frozen=True)
class NormBackward:
    """Gradients of ``sum(y * dy)`` with respect to the input and the affine parameters."""

    dx: np.ndarray
    dweight: np.ndarray | None  # (C,); None only when the forward had no weight
    dbias: np.ndarray | None  # (C,); None only when the forward had no bias


# ----------------------------------------------------------------------------- validation


def as_working(a) -> np.ndarray:
    """A C-contiguous version of ``a`` in the working precision (``a`` itself when it already is one).

    The reference only ever reads its inputs, so returning the caller's array is safe.
    """
    return np.ascontiguousarray(a, dtype=working())


def as_ncs(x, op: str) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (N, C, *spatial), 0..3 spatial dims, in the working precision and as an ``(N, C, S)`` view."""
    x = as_working(x)
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"{op}: x must have 2 to 5 dims (N, C, *spatial), got shape {x.shape}")
    return x, x.reshape(x.shape[0], x.shape[1], int(np.prod(x.shape[2:])))


def check_eps(eps: float, op: str) -> float:
    eps = float(eps)
    if not eps >= 0.0:  # also rejects NaN
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    return eps


def per_channel(a, channels: int, name: str, op: str) -> np.ndarray | None:
    """Validate an optional per-channel vector (weight, bias, running stats)."""
    if a is None:
        return None
    a = as_working(a)
    if a.shape != (channels,):
        raise ValueError(
            f"{op}: {name} must have shape ({channels},) (one value per channel), got {a.shape}"
        )
    return a


def as_rows(x, normalized_shape, op: str) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """x in the working precision, its leading (row) dims and D, checked against ``normalized_shape`` (the last dims)."""
    x = as_working(x)
    d = tuple(int(s) for s in normalized_shape)
    if not 1 <= len(d) <= x.ndim or tuple(x.shape[x.ndim - len(d):]) != d:
        raise ValueError(f"{op}: normalized_shape {d} must match the last dims of x, got shape {x.shape}")
    return x, tuple(x.shape[: x.ndim - len(d)]), d


def per_element(a, d: tuple[int, ...], name: str, op: str) -> np.ndarray | None:
    """Validate an optional parameter of one value per element of D (LayerNorm, RMSNorm), flattened."""
    if a is None:
        return None
    a = as_working(a)
    if a.shape != d:
        raise ValueError(f"{op}: {name} must have shape {d} (normalized_shape), got {a.shape}")
    return a.reshape(-1)


def check_dy(dy, x_shape: tuple[int, ...], op: str) -> np.ndarray:
    dy = as_working(dy)
    if dy.shape != tuple(x_shape):
        raise ValueError(f"{op}: dy must have the shape of x {tuple(x_shape)}, got {dy.shape}")
    return dy


def inv_sqrt(var: np.ndarray, eps: float) -> np.ndarray:
    """``1 / sqrt(var + eps)``; ``var + eps == 0`` gives inf (as torch), without a warning."""
    with np.errstate(divide="ignore"):
        return 1.0 / np.sqrt(var + eps)


# -------------------------------------------------------------------------------- grouping


def groups(count: int, unit: int, min_units: int = 1, budget: int | None = None) -> list[slice]:
    """Split ``count`` units of ``unit`` elements each into runs of about ``budget`` elements
    (default ``GROUP_ELEMS``).

    A run holds at least ``min_units`` units (so a unit larger than the budget is a group of
    its own).
    """
    budget = GROUP_ELEMS if budget is None else budget
    step = max(min_units, budget // max(unit, 1), 1)
    return [slice(i, min(i + step, count)) for i in range(0, count, step)]


def channel_rows(v: np.ndarray, s: int) -> np.ndarray:
    """Per-channel values ``v`` (q,) expanded to ``(q, s)`` rows, broadcastable over a batch."""
    return np.repeat(v, s).reshape(v.shape[0], s)


def scratch_like(a: np.ndarray, buf: list) -> np.ndarray:
    """A C-contiguous array shaped like ``a``, carved from a buffer reused across groups."""
    if not buf or buf[0].size < a.size or buf[0].dtype != a.dtype:
        buf[:] = [np.empty(a.size, a.dtype)]
    return buf[0][: a.size].reshape(a.shape)


# ------------------------------------------------------------------------------ reductions
# All take (p, q, r) arrays; "r" is the spatial axis, contiguous in memory.


def sum_r(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis -> ``(p, q)``."""
    return np.einsum("pqr->pq", a)


def dot_r(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum(a * b)`` over the last axis -> ``(p, q)``."""
    if a.shape[-1] >= _SHORT_RUN:
        return _vecdot(a, b)
    return np.einsum("pqr,pqr->pq", a, b)


def sum_pr(a: np.ndarray) -> np.ndarray:
    """Sum over axes 0 and 2 -> ``(q,)``."""
    return np.einsum("pqr->q", a)


def dot_pr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum(a * b)`` over axes 0 and 2 -> ``(q,)``."""
    if a.shape[-1] >= _SHORT_RUN:
        return np.add.reduce(_vecdot(a, b), axis=0)
    return np.einsum("pqr,pqr->q", a, b)


def sum_rows(a: np.ndarray) -> np.ndarray:
    """Sum of each ``p``-slab of a C-contiguous ``(p, q, r)`` array -> ``(p,)``."""
    return sum_r(a.reshape(a.shape[0], 1, -1))[:, 0]


def dot_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum(a * b)`` over each ``p``-slab of C-contiguous ``(p, q, r)`` arrays -> ``(p,)``."""
    p = a.shape[0]
    return dot_r(a.reshape(p, 1, -1), b.reshape(p, 1, -1))[:, 0]
