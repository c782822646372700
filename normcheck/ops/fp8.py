"""fp8 output (Case.fp8: "e4m3" or "e5m2"; None: none), an Extension of LayerNorm's and RMSNorm's records.

With it the contract passes two keywords more and returns two tensors more:

    fn(..., eps, scale=scale, fp8_dtype=dtype) -> (y, y_fp8, amax)

`scale`: a float32 scalar tensor; `fp8_dtype`: torch.float8_e4m3fn or torch.float8_e5m2. y is returned in the case's
dtype as without fp8 (differentiable: the backward takes dy in that dtype; torch would cast a cotangent of an fp8
output to fp8). y_fp8 = saturate(y · scale) rounded to the fp8 dtype (not differentiated), amax = max |y| of the
unquantised y, a float32 scalar. The case draws the scale from y's range (reference.fp8.saturating_scale): a power
of two at which y's largest values saturate and the rest do not.

y_fp8 is compared as stored, in the fp8 numbers' scaled units: the budget ratio is the same as after dequantising
both sides (dividing by the scale), and the engine's rules for a storage dtype (a reference value past the range,
subnormal noise, the baseline rounded to the output's dtype) apply to the fp8 dtype as to any other.

The reference and the budget are those of a quantising cast stage after the norm (reference.stages.Cast,
engine.stage_bounds.cast_after; docs/tolerance.md): y_fp8 gets y's own bound times the scale, plus one fp8 ulp where
that interval around y·scale holds a rounding midpoint; amax, how far y's element errors move max |y|.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..core.errors import UsageError
from ..numerics.dtypes import FP8_FORMATS
from ..reference.fp8 import saturating_scale
from ..reference.stages import Cast
from .core import CaseField, Extension, Operand, Result

KEYWORDS = "scale=scale, fp8_dtype=dtype"
RETURNS = "(y, y_fp8, amax)"
TORCH_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def fp8_dtype(case) -> str:
    return case.fp8


def f32(case) -> str:
    return "f32"


def scalar(case) -> tuple[int, ...]:
    return ()


FIELD = CaseField("fp8", None, "the implementation also returns y quantised to fp8 with a scale, and y's amax: e4m3 "
                  "(float8_e4m3fn) or e5m2 (float8_e5m2); the contract then passes scale= and fp8_dtype= and takes "
                  "(y, y_fp8, amax) back", choices=FP8_FORMATS, metavar="FORMAT", label="fp8={}",
                  probes=())  # (a hint never tries it: it changes the interface, not how the layer is defined)


def refuse_arrays(case) -> None:
    """The array contract (JAX, TensorFlow) has no fp8 output yet: one line instead of a misleading failure."""
    if case.fp8 is not None:
        raise UsageError(f"--fp8 {case.fp8}: {case.op}'s array contract (JAX, TensorFlow) has no fp8 output yet; "
                         "give a torch implementation")


def keywords(t, case) -> dict:
    """The contract's fp8 keywords for a case (none without fp8)."""
    if case.fp8 is None:
        return {}
    import torch
    return {"scale": t.extra["scale"], "fp8_dtype": getattr(torch, TORCH_NAMES[case.fp8])}


def extension(forward: Callable) -> Extension:
    """fp8 output of the op whose y `forward(case_inputs)` gives (its float64 reference's): a quantising cast after
    the norm (reference.stages.Cast), with a scale each case draws from y's range."""
    def scale(inputs) -> np.ndarray:
        return np.asarray(saturating_scale(forward(inputs), inputs.case.fp8))

    return Extension("fp8", operands=(Operand("scale", dtype=f32, shape=scalar, derive=scale),),
                     results=(Result("y_fp8", dtype=fp8_dtype), Result("amax", dtype=f32, shape=scalar)),
                     stages=(Cast("scale", "y_fp8", "amax"),))


def quantised(y: "torch.Tensor", scale: "torch.Tensor", fp8_dtype: "torch.dtype"):
    """(y, y_fp8, amax) from torch's y: y · scale in float32, clamped to the format's range and cast (round to
    nearest even), the amax of y in float32; neither is differentiated."""
    import torch
    with torch.no_grad():
        limit = torch.finfo(fp8_dtype).max
        y_fp8 = (y.float() * scale).clamp(-limit, limit).to(fp8_dtype)
        amax = y.abs().amax().float() if y.numel() else torch.zeros((), dtype=torch.float32)
    return y, y_fp8, amax
