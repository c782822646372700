"""Dtype specs: the storage dtype of x/dy/y/dx, the dtype of γ/β/running stats, and rounding units."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import UsageError

TORCH_DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
}

# Unit roundoff u = 2^-p (half an ulp at 1) of each storage dtype.
UNIT_ROUNDOFF = {"f64": 2.0**-53, "f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}

# Smallest positive normal number: errors below this are subnormal noise, never a finding.
TINY = {name: float(torch.finfo(dt).tiny) for name, dt in TORCH_DTYPES.items()}

# The spellings accepted on the command line: plain dtypes, and mixed ones where a
# half-precision input comes with float32 weight, bias and running statistics.
DTYPE_CHOICES = ("f64", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16")


@dataclass(frozen=True)
class DtypeSpec:
    """Input dtype plus parameter dtype (γ, β, running stats)."""

    dtype: str
    param_dtype: str

    @property
    def label(self) -> str:
        return self.dtype if self.dtype == self.param_dtype else f"{self.dtype}/{self.param_dtype}"

    @property
    def is_mixed(self) -> bool:
        return self.dtype != self.param_dtype

    @property
    def accumulation(self) -> str:
        """The precision a correct kernel accumulates in: float64 for float64, float32 otherwise."""
        return "f64" if self.dtype == "f64" else "f32"

    @property
    def moments(self) -> str:
        """Saved mean/invstd: the accumulation precision, or the parameter dtype where that is coarser."""
        return self.param_dtype if UNIT_ROUNDOFF[self.param_dtype] > UNIT_ROUNDOFF[self.accumulation] else self.accumulation


def parse_dtype(text: str) -> DtypeSpec:
    """'bf16' -> bf16/bf16, 'mixed-bf16' -> bf16 input with f32 parameters."""
    if text not in DTYPE_CHOICES:
        raise UsageError(f"unknown dtype {text!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    if text.startswith("mixed-"):
        return DtypeSpec(text[len("mixed-"):], "f32")
    return DtypeSpec(text, text)


def quantise(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to `dtype` and return them as float64 (exactly representable)."""
    return torch.from_numpy(np.asarray(values, dtype=np.float64)).to(TORCH_DTYPES[dtype]).double().numpy()


def dtype_name(dtype: torch.dtype) -> str:
    for name, dt in TORCH_DTYPES.items():
        if dt == dtype:
            return name
    return str(dtype).replace("torch.", "")
