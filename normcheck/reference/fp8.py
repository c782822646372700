"""A norm's output quantised to an 8-bit float with a scale (LayerNorm's and RMSNorm's Case.fp8), as fp8 training
recipes store activations:

    y_fp8 = round_fp8(clamp(y · scale, −max, max))      amax = max |y|   (of the unquantised y)

round_fp8 rounds to the nearest even number of the format (float8_e4m3fn: max 448; float8_e5m2: max 57344); the
clamp saturates what the scale pushes past the format's range. amax is what a recipe derives the next step's scale
from. y_fp8 is given as stored (in the scaled units of the fp8 numbers): y_fp8 / scale is y dequantised. The cast is a
stage after the norm (reference.stages.Cast); this module draws the scale it is given.
"""
from __future__ import annotations

import numpy as np

from ..numerics.dtypes import FP8_MAX


def saturating_scale(y: np.ndarray, fmt: str) -> float:
    """A power of two that takes y's largest magnitude to [max, 2·max) of the format: y·scale saturates there and
    nowhere below half of it (a product with a power of two is exact in every dtype a kernel may form it in)."""
    top = float(np.max(np.abs(y), initial=0.0))
    if not 0 < top < np.inf:
        return 1.0
    return float(np.exp2(np.clip(np.ceil(np.log2(FP8_MAX[fmt] / top)), -100, 100)))
