"""Dtype specs: the storage dtype of x/dy/y/dx, the dtype of γ/β/running stats, and rounding units.

Dtypes are named ("f64", "f32", "f16", "bf16"); frameworks map the names to their own types.
`quantise` rounds float64 values exactly as torch's `.to(dtype)` does (bf16 and f16 through float32,
round to nearest even), so every framework sees the same quantised inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import UsageError

DTYPES = ("f64", "f32", "f16", "bf16")
# The 8-bit output formats (Case.fp8: LayerNorm's and RMSNorm's y quantised with a scale): float8_e4m3fn (no inf:
# torch's cast saturates at ±448) and float8_e5m2 (overflow is ±inf). Storage dtypes of an output, not of a case.
FP8_FORMATS = ("e4m3", "e5m2")
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
# mantissa bits, smallest normal exponent, whether a cast saturates (rather than overflowing to inf)
_FP8 = {"e4m3": (3, -6, True), "e5m2": (2, -14, False)}

# Unit roundoff u = 2^-p (half an ulp at 1) of each storage dtype.
UNIT_ROUNDOFF = {"f64": 2.0**-53, "f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "e4m3": 2.0**-4, "e5m2": 2.0**-3}

# Smallest positive normal number: errors below this are subnormal noise, never a finding.
TINY = {"f64": float(np.finfo(np.float64).tiny), "f32": float(np.finfo(np.float32).tiny),
        "f16": float(np.finfo(np.float16).tiny), "bf16": float(np.finfo(np.float32).tiny),  # bf16: f32's exponent
        "e4m3": 2.0**-6, "e5m2": 2.0**-14}

# Largest finite value of each storage dtype: a value smaller in magnitude never rounds to ±inf there (rounding is
# monotonic and this value is representable), so only arrays that reach it need quantising to find an overflow
FINITE_MAX = {"f64": float(np.finfo(np.float64).max), "f32": float(np.finfo(np.float32).max),
              "f16": float(np.finfo(np.float16).max), "bf16": (2 - 2.0**-7) * 2.0**127, **FP8_MAX}

# The spellings accepted on the command line: plain dtypes, and mixed ones where a
# half-precision input comes with float32 weight, bias and running statistics.
DTYPE_CHOICES = ("f64", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16")


# What an implementation may declare of its precision (Case.compute_dtype): the finest precision it computes in.
# f64: no limit (as fine as the input dtype allows); f32: at most float32, float64 input included.
COMPUTE_DTYPES = ("f64", "f32")
# What dtype y comes back in (Case.output_dtype): the input's, or result_type over x and every floating parameter and
# buffer the layer uses in the case (Op.promotes_through: a mixed case's f32).
OUTPUT_DTYPES = ("input", "promote")


@dataclass(frozen=True)
class DtypeSpec:
    """Input dtype plus parameter dtype (γ, β, running stats), and the finest precision the kernel computes in."""

    dtype: str
    param_dtype: str
    compute: str = "f64"

    def unit(self, dtype: str) -> float:
        """The unit roundoff of a value stored in `dtype` by a kernel that computes at most in `compute`."""
        return max(UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF[self.compute])

    @property
    def label(self) -> str:
        return self.dtype if self.dtype == self.param_dtype else f"{self.dtype}/{self.param_dtype}"

    @property
    def is_mixed(self) -> bool:
        return self.dtype != self.param_dtype

    @property
    def accumulation(self) -> str:
        own = accumulation(self.dtype)
        return self.compute if UNIT_ROUNDOFF[self.compute] > UNIT_ROUNDOFF[own] else own

    @property
    def moments(self) -> str:
        """Saved mean/invstd: the accumulation precision, or the parameter dtype where that is coarser."""
        return self.param_dtype if UNIT_ROUNDOFF[self.param_dtype] > UNIT_ROUNDOFF[self.accumulation] else self.accumulation


# Where a layer rounds to the input dtype relative to its weight multiply (RMSNorm kernels differ):
#   end            everything in float32, rounded once at the end (torch's F.rms_norm, Gemma; T5's too, as far
#                  as any budget can tell: it rounds x̂ to a half weight's dtype, which y's own rounding covers)
#   before-weight  x̂ rounded to the input dtype, then · w (Llama); dw sees the rounded x̂ too
#   rstd-input     rstd rounded to the input dtype, x · rstd formed there (rounded), then · w; dw sees that x̂
CASTINGS = ("end", "before-weight", "rstd-input")
ROUNDS_XHAT = ("before-weight", "rstd-input")  # the chains in which the weight sees an x̂ rounded to the input dtype


def weight_sees(xhat: np.ndarray, casting: str | None, dtype: str, x: np.ndarray | None = None,
                rstd: np.ndarray | None = None) -> np.ndarray:
    """x̂ = x · rstd as the weight multiply sees it under `casting` (None: the op has no casting chain); rstd-input
    needs x and rstd themselves. In xhat's own dtype (the baseline's arithmetic is the reference's)."""
    if casting == "rstd-input":
        return quantise(x * quantise(rstd, dtype), dtype).astype(xhat.dtype)
    return quantise(xhat, dtype).astype(xhat.dtype) if casting == "before-weight" else xhat


def may_round_across(values: np.ndarray, error: np.ndarray, dtype: str) -> np.ndarray:
    """One `dtype` ulp where a value known to within `error` may round to the other neighbour (it lies
    that close to a midpoint between two `dtype` numbers), else 0: what a rounding step can flip. The midpoints
    beside its rounded value q are q ± half the spacing on each side; below a power of two the spacing is half
    the one above it (the binade below), so the midpoint there is a quarter of q's ulp away."""
    q, a = np.abs(quantise(values, dtype)), np.abs(np.asarray(values, dtype=np.float64))
    with np.errstate(divide="ignore"):
        binade = np.exp2(np.floor(np.log2(np.maximum(q, TINY[dtype]))))
    ulp = 2 * UNIT_ROUNDOFF[dtype] * binade
    below = np.where((q == binade) & (q > TINY[dtype]), ulp / 2, ulp)  # the spacing down to q's lower neighbour
    nearest = np.minimum(np.abs(a - (q + ulp / 2)), np.abs(a - (q - below / 2)))
    # a narrower format rounds through float32 first (quantise, as torch): within float32's rounding of a
    # midpoint, a value may land on it and tie to the other neighbour
    through = a * UNIT_ROUNDOFF["f32"] if UNIT_ROUNDOFF[dtype] > UNIT_ROUNDOFF["f32"] else 0.0
    return np.where(nearest <= error + through, ulp, 0.0)


def accumulation(dtype: str) -> str:
    """The precision a correct kernel accumulates `dtype` data in: float64 for float64, float32 otherwise."""
    return "f64" if dtype == "f64" else "f32"


def parse_dtype(text: str) -> DtypeSpec:
    """'bf16' -> bf16/bf16, 'mixed-bf16' -> bf16 input with f32 parameters."""
    if text not in DTYPE_CHOICES:
        raise UsageError(f"unknown dtype {text!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    if text.startswith("mixed-"):
        return DtypeSpec(text[len("mixed-"):], "f32")
    return DtypeSpec(text, text)


def quantise(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to `dtype` and return them as float64 (exactly representable).

    Like torch, f16, bf16 and the fp8 formats round through float32 (round to nearest even at each step); like
    torch's cast, e4m3 saturates at ±448 (±inf included) and e5m2 overflows to ±inf.
    """
    a = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "f64":
            return a.copy()
        f = a.astype(np.float32)
        if dtype == "f32":
            return f.astype(np.float64)
        if dtype == "f16":
            return f.astype(np.float16).astype(np.float64)
        if dtype == "bf16":
            bits = f.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            out = rounded.astype(np.uint32).view(np.float32)
            return np.where(np.isnan(f), np.float32(np.nan), out).astype(np.float64)
        if dtype in _FP8:
            return _fp8(f.astype(np.float64), dtype)
    raise UsageError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


def _fp8(f: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values (as float64) rounded to the nearest even fp8 number of `fmt`, torch's overflow included."""
    mantissa, lowest, saturates = _FP8[fmt]
    _, exponent = np.frexp(f)  # f = m·2^exponent, 0.5 <= |m| < 1 (0 and ±inf: exponent 0)
    ulp = np.exp2(np.maximum(exponent - 1, lowest) - mantissa)  # the spacing at f (subnormals: at the smallest normal)
    q = np.rint(f / ulp) * ulp  # (exact: a power-of-two scaling; rint rounds halves to even)
    over = np.abs(q) > FP8_MAX[fmt]  # (NaN is not)
    return np.where(over, np.copysign(FP8_MAX[fmt] if saturates else np.inf, f), q)


def saturate(values: np.ndarray, fmt: str) -> np.ndarray:
    """Values clamped to the finite range of the fp8 format `fmt` (what a scaled cast does before it rounds)."""
    return np.clip(values, -FP8_MAX[fmt], FP8_MAX[fmt])
