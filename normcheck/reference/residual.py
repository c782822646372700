"""Residual add + norm (a pre-norm transformer block's fused kernel): the layer adds the sublayer's output x to
the residual stream, normalises the sum and returns both.

Math
----
    h = q(x + residual)        q: rounding to the residual stream's dtype (the stream is stored, and read by
                               the norm, as h)
    y = N(h)                   N: the inner norm (RMSNorm, LayerNorm) with its own parameters

For L = <dy, y> + <dh, h> (q passed straight through, as autograd does for a cast), h's gradient is dh plus
the norm's own, and the add hands it to both summands unchanged::

    dx = dresidual = dh + N'(h)ᵀ·dy        dγ, dβ: the inner norm's, of h

so the backward is the inner norm's backward on h, plus dh. Dropping dh, normalising x instead of h and
rounding h to a narrower dtype than declared are the bug classes this makes visible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._moments import as_working


@dataclass(frozen=True)
class Prologue:
    """An element-wise prologue of a fused norm: the norm normalises `output` = the sum of `summands` (rounded to
    the output's dtype), which the layer also returns, differentiated with `cotangent`. Each summand's gradient is
    the output's cotangent plus the norm's gradient of the output (the tolerance model bounds it so)."""
    name: str
    summands: tuple[str, ...]
    output: str
    cotangent: str


RESIDUAL_ADD = Prologue("residual-add", ("x", "residual"), "h", "dh")


def residual_add(x, residual, rounding: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """h = q(x + residual) in the working precision (`rounding`: q, None for none)."""
    h = as_working(x) + as_working(residual)
    return h if rounding is None else as_working(rounding(h))


def residual_backward(norm_dx, dh) -> np.ndarray:
    """dx = dresidual = dh + the norm's gradient of h (the norm's gradient alone where h is not returned: dh None)."""
    return as_working(norm_dx) if dh is None else as_working(norm_dx) + as_working(dh)
