"""Failures of torch's own kernels that normcheck found and that are not ours to fix.

Each record names the cases it covers. A failing case covered by a known issue is reported as
KNOWN (with the numbers, never hidden) and does not fail the run unless `--strict` is given; a
covered case that passes is simply PASS. tests/test_known_issues.py reproduces every record on
the torch version it was recorded with, so the list cannot silently go stale.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cases import Case

RECORDED_WITH_TORCH = "2.13"

# Profiles with values of large magnitude (|x − mean|·|dy| ≫ 1): where f16 intermediates overflow.
_LARGE_MAGNITUDE_PROFILES = ("offset", "heavy_tailed")
_CHANNELS_LAST = ("channels_last", "channels_last_3d")


@dataclass(frozen=True)
class KnownIssue:
    key: str
    summary: str
    applies: Callable[[Case], bool]


BN_MIXED_SLOW_PATH = KnownIssue(
    "torch-bn-mixed-slow-path",
    "torch CPU batch_norm backward with f16/bf16 input and f32 parameters, when x is strided or x and dy "
    "have different memory formats, rounds dweight/dbias (and intermediate dx terms) to the input dtype",
    lambda c: c.dtypes.is_mixed and (c.x_format != c.dy_format or "strided" in (c.x_format, c.dy_format)),
)

BN_F16_INTERMEDIATES = KnownIssue(
    "torch-bn-f16-intermediates",
    "torch CPU batch_norm backward in plain f16 (f16 parameters) keeps Σ dy·(x − mean) and other "
    "intermediates in f16: inf/NaN when |dy|·|x − mean|·count exceeds 65504 although every true result is "
    "representable; sums rounded in f16 on the channels-last, strided and mixed-layout paths (near-constant "
    "channels, 65536-element sets: dx errors 10× the budget)",
    lambda c: c.dtypes.dtype == "f16" and not c.dtypes.is_mixed,
)

BN_CHANNELS_LAST_F32_CANCELLATION = KnownIssue(
    "torch-bn-channels-last-f32-cancellation",
    "torch CPU batch_norm backward in f32 on channels_last input loses all accuracy when |mean| ≫ std and "
    "the set is large (dx 225 instead of 0.01 at 16x3x64x64 with |mean| ~ 5e3): Σ dy·(x − mean) is "
    "formed by cancellation",
    lambda c: c.dtypes.dtype == "f32" and c.x_format in _CHANNELS_LAST,
)

GN_CHANNELS_LAST_VARIANCE = KnownIssue(
    "torch-gn-channels-last-variance",
    "torch CPU group_norm on channels_last input computes the variance as E[x²] − E[x]²: catastrophic "
    "cancellation when |mean| ≫ std (f32 dx off by 1e7×, f64 off by ~1e-8 relative); small sets hit it "
    "by chance in any profile",
    lambda c: c.x_format in _CHANNELS_LAST,
)

GN_MIXED_MOMENTS = KnownIssue(
    "torch-gn-mixed-moments",
    "torch CPU group_norm with f16/bf16 input and f32 parameters rounds mean and rstd to the input dtype "
    "(returned as f32): the 'low-precision moments' bug, large dx errors when |mean| ≫ std",
    lambda c: c.dtypes.is_mixed,
)

GN_F16_OVERFLOW = KnownIssue(
    "torch-gn-f16-overflow",
    "torch CPU group_norm backward in plain f16 accumulates per-channel Σ dy·x in f16: dweight overflows to inf "
    "for large |x|·|dy|·count although the true dweight is representable",
    lambda c: c.dtypes.dtype == "f16" and not c.dtypes.is_mixed and c.profile in _LARGE_MAGNITUDE_PROFILES,
)

GN_NATIVE_DY_LAYOUT = KnownIssue(
    "torch-gn-native-dy-layout",
    "aten.native_group_norm_backward reads dy with x's memory format: a dy in another layout gives silently "
    "wrong gradients (autograd hides this by converting dy first; direct callers are exposed)",
    lambda c: c.dy_format != c.x_format,
)


SYNCBN_EMPTY_RANK_HALF = KnownIssue(
    "torch-syncbn-empty-rank-half",
    "torch.nn.modules._functions.SyncBatchNorm: an empty rank sends zeros in the INPUT dtype (f16/bf16) while "
    "the others send float32 statistics, so the all_gather sizes differ: gloo aborts the process (SIGABRT, "
    "'Received data size doesn't match expected size'); on NCCL the gather is corrupt or hangs",
    lambda c: c.dtype in ("f16", "bf16") and c.split is not None and 0 in c.split,
)
