"""fp8 output (Case.fp8) for any norm under its plain contract (LayerNorm's, RMSNorm's), correct and with the bug
classes of real fp8-output kernels: amax taken after quantisation, the scale divided by instead of multiplied by,
no saturation (e5m2 overflows to inf; torch's e4m3fn cast saturates by itself), the other format's range, amax of
x, of y without |·| or of one block only, y·scale rounded toward zero or through bf16 first, and y returned as the
dequantised fp8 values.

The correct style (`fused`) computes y once in the accumulation dtype, as a fused kernel does, and rounds it to
the case dtype (y) and to fp8 (y_fp8) separately, amax from the unrounded y; torch's own record (ops/fp8.py)
quantises the y it returns instead (two roundings). Both are in the budget.
"""
from __future__ import annotations

import torch

from normcheck import Impl
from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code

BUGS = ("amax_after_quantisation", "scale_divides", "no_saturation", "other_formats_range", "amax_of_x",
        "amax_without_abs", "amax_of_first_block", "rounds_toward_zero", "quantises_through_bf16",
        "returns_dequantised_y")
# The format each bug is judged in: e4m3 unless it shows only in e5m2's (torch's e4m3fn cast saturates by itself)
FORMAT = {bug: "e5m2" if bug in ("no_saturation", "other_formats_range", "rounds_toward_zero") else "e4m3"
          for bug in BUGS}
BLOCK = 1024  # elements of the first block (amax_of_first_block)
MANTISSA = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
OTHER = {torch.float8_e4m3fn: torch.float8_e5m2, torch.float8_e5m2: torch.float8_e4m3fn}


def _quantise(y_acc: torch.Tensor, scale, fp8_dtype, bug: str | None) -> torch.Tensor:
    limit = torch.finfo(OTHER[fp8_dtype] if bug == "other_formats_range" else fp8_dtype).max
    y = y_acc.to(torch.bfloat16).to(y_acc.dtype) if bug == "quantises_through_bf16" else y_acc
    scaled = (y / scale if bug == "scale_divides" else y * scale).float()
    if bug != "no_saturation":
        scaled = scaled.clamp(-limit, limit)
    if bug == "rounds_toward_zero":  # the float32 mantissa cut to the format's bits (normal fp8 numbers)
        drop = 23 - MANTISSA[fp8_dtype]
        scaled = (scaled.view(torch.int32) & ~((1 << drop) - 1)).view(torch.float32)
    return scaled.to(fp8_dtype)


def _amax(x, y_acc, y_fp8, scale, bug: str | None) -> torch.Tensor:
    if not y_acc.numel():
        return torch.zeros((), dtype=torch.float32)
    if bug == "amax_after_quantisation":
        return (y_fp8.float() / scale).abs().amax()
    if bug == "amax_of_x":
        return x.abs().amax().float()
    if bug == "amax_without_abs":
        return y_acc.amax().float()
    if bug == "amax_of_first_block":  # a per-block reduction never combined across blocks
        return y_acc.reshape(-1)[:BLOCK].abs().amax().float()
    return y_acc.abs().amax().float()


def fused(norm, bug: str | None = None):
    """`norm` (a plain contract: F.layer_norm's or F.rms_norm's signature) with fp8 output, the fused style: y in
    the accumulation dtype (the inputs and parameters upcast), rounded once to the case dtype and once to fp8."""
    def fp8_norm(input, normalized_shape, *rest, scale, fp8_dtype):
        acc = accumulation_dtype(input.dtype)
        y_acc = norm(input.to(acc), normalized_shape, *(p.to(acc) if isinstance(p, torch.Tensor) else p for p in rest))
        with torch.no_grad():
            y_fp8 = _quantise(y_acc.detach(), scale, fp8_dtype, bug)
            amax = _amax(input, y_acc.detach(), y_fp8, scale, bug)
        y = y_acc.to(input.dtype)
        if bug == "returns_dequantised_y":  # the dequantised fp8 values as y (the gradient still y's)
            y = y + ((y_fp8.to(acc) / scale).to(input.dtype) - y).detach()
        return y, y_fp8, amax
    return fp8_norm


def records(norm, op: str, follows: dict, module: str) -> tuple[dict, dict]:
    """(MUTANTS, CORRECT) of `op`: Impl records under `follows` and the fp8 format each is judged in, named
    fp8_<bug> (and fp8_e4m3, fp8_e5m2 for the correct style) so that `--impl <module>:<name>` finds them."""
    def record(name: str, fmt: str, bug: str | None, what: str) -> Impl:
        fn = fused(norm, bug)
        fn.__module__ = module
        return test_code(op, name, fn, what, {**follows, "fp8": fmt})

    mutants = {f"fp8_{bug}": record(f"fp8_{bug}", FORMAT[bug], bug, f"mutant: fp8 {bug}") for bug in BUGS}
    correct = {f"fp8_{fmt}": record(f"fp8_{fmt}", fmt, None, f"textbook {op}, y fused-quantised to fp8 {fmt}")
               for fmt in ("e4m3", "e5m2")}
    return mutants, correct
