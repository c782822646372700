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

Budget (docs/tolerance.md): y_fp8 gets y's own bound times the scale, plus what rounding makes of any value within
that bound of y·scale: one fp8 ulp where the interval holds a midpoint between two fp8 numbers (at a power of two,
the ulp of the binade below counts too), 0 elsewhere (saturation is 1-Lipschitz: the range's edge adds nothing).
amax gets the largest error max |y| can take from y's element errors, max(B(y) at the argmax, max(|y| + B(y)) −
max |y|), plus its own rounding to float32.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..core.errors import UsageError
from ..numerics.dtypes import FP8_FORMATS, TINY, quantise, saturate
from ..reference.fp8 import fp8_outputs, saturating_scale
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
    """fp8 output of the op whose y `forward(case_inputs)` gives (its float64 reference's)."""
    def scale(inputs) -> np.ndarray:
        return np.asarray(saturating_scale(forward(inputs), inputs.case.fp8))

    def bounds(case, inputs, bounds: dict, c) -> dict[str, np.ndarray]:
        # y's bound is relative to y; stored subnormal (f16: below 6.1e-5) y rounds to its absolute spacing instead,
        # which y's own comparison forgives (engine.tolerance: + tiny) and the scale magnifies
        y_dtype = case.record.output_dtype(case, "y")
        y, bound = forward(inputs), bounds["y"] + c.rounding * case.dtypes.unit(y_dtype) * TINY[y_dtype]
        s = float(inputs.extra["scale"])
        error = s * bound
        out = {"y_fp8": error + rounding_spread(y * s, error, case.fp8)}
        magnitude = np.abs(y)
        if magnitude.size:
            top = int(np.argmax(magnitude))
            # max|y| moves by at most B(y) at its argmax downward, and by max(|y| + B(y)) − max|y| upward
            moved = max(float(bound.flat[top]), float(np.max(magnitude + bound)) - float(magnitude.flat[top]))
            out["amax"] = np.asarray(moved + c.rounding * case.dtypes.unit("f32") * float(magnitude.flat[top]))
        else:
            out["amax"] = np.asarray(0.0)
        return out

    return Extension("fp8", operands=(Operand("scale", dtype=f32, shape=scalar, derive=scale),),
                     results=(Result("y_fp8", dtype=fp8_dtype), Result("amax", dtype=f32, shape=scalar)), bounds=bounds)


def rounding_spread(values: np.ndarray, error: np.ndarray, fmt: str) -> np.ndarray:
    """How far the stored (saturated, rounded) value of anything within `error` of `values` may lie from that of
    `values`: 0 where they all round alike, one fp8 ulp where the interval holds a midpoint (at a power of two, the
    ulp of the binade the other value falls in). Saturation is 1-Lipschitz: the range's edge adds nothing."""
    stored = [quantise(saturate(v, fmt), fmt) for v in (values - error, values, values + error)]
    return np.maximum(np.abs(stored[0] - stored[1]), np.abs(stored[2] - stored[1]))


def outputs(y: np.ndarray, inputs) -> dict[str, np.ndarray]:
    """{y_fp8, amax} of a case with fp8 ({} without), from the reference's y."""
    if inputs.case.fp8 is None:
        return {}
    return fp8_outputs(y, inputs.extra["scale"], inputs.case.fp8)


def quantised(y: "torch.Tensor", scale: "torch.Tensor", fp8_dtype: "torch.dtype"):
    """(y, y_fp8, amax) from torch's y: y · scale in float32, clamped to the format's range and cast (round to
    nearest even), the amax of y in float32; neither is differentiated."""
    import torch
    with torch.no_grad():
        limit = torch.finfo(fp8_dtype).max
        y_fp8 = (y.float() * scale).clamp(-limit, limit).to(fp8_dtype)
        amax = y.abs().amax().float() if y.numel() else torch.zeros((), dtype=torch.float32)
    return y, y_fp8, amax
