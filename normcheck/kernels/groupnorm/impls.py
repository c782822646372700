"""Registered GroupNorm implementations: normcheck's channels-last kernel and torch, at 1/2/3 threads.

``IMPLS`` (op "groupnorm"):
* ``cl-{auto,groups,pixels}-t{1,2,3}``: normcheck's kernel through autograd, strategy forced or automatic.
* ``torch-cl-t{1,2,3}``: torch.nn.functional.group_norm through autograd.
* ``torch-native-cl-t{1,2,3}``: aten.native_group_norm + aten.native_group_norm_backward called directly.

Every runner adds ``_path``: for ours the path the backward took (strategy/gamma/dx/mixed/2d); for torch
the path torch's rules predict from the case ("torch:" + groups when HxW < 2048 else pixels, ...).
The torch ones are restricted to the cases ours takes, so the rows line up.
"""
from __future__ import annotations

from math import prod

import torch
import torch.nn.functional as F

from ...cases import Case, TorchInputs
from ...dtypes import TORCH_DTYPES
from ...known_issues import (
    GN_CHANNELS_LAST_VARIANCE,
    GN_F16_OVERFLOW,
    GN_MIXED_MOMENTS,
    GN_NATIVE_DY_LAYOUT,
)
from ...registry import Impl
from ...runners import functional_groupnorm, native_groupnorm_backward
from . import (
    DEFAULT_THRESHOLD,
    group_norm,
    last_backward_path,
    path_name,
    validate_layout,
)

THREADS = (1, 2, 3)
_CL_FORMAT = {4: "channels_last", 5: "channels_last_3d"}
CAPABILITIES = ("x 4-D channels_last or 5-D channels_last_3d (any dy format: converted); f64, f32, f16, bf16, "
                "mixed-f16, mixed-bf16")


def supports(case: Case) -> str | None:
    """The kernel's own validation, applied to the case's shape, dtypes and x layout."""
    rank = len(case.shape)
    fmt = case.x_format
    is_cl = _CL_FORMAT.get(rank) == fmt or (fmt == "contiguous" and rank in (4, 5) and _ambiguous(case.shape))
    pd = TORCH_DTYPES[case.param_dtype] if case.affine else None
    return validate_layout(case.shape, TORCH_DTYPES[case.dtype], is_cl, fmt, "cpu", case.groups,
                           [("weight", pd), ("bias", pd)])


def _ambiguous(shape) -> bool:
    """A contiguous tensor that is channels-last too (C == 1 or one pixel)."""
    t = torch.empty(shape, device="meta")
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return t.is_contiguous(memory_format=fmt)


def _with_threads(run, threads: int):
    def runner(case: Case, t: TorchInputs):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return run(case, t)
        finally:
            torch.set_num_threads(old)

    return runner


def ours(strategy: str, threads: int, threshold: int = DEFAULT_THRESHOLD):
    def fn(x, groups, weight, bias, eps):
        return group_norm(x, groups, weight, bias, eps, strategy=strategy, threshold=threshold, threads=threads)

    base = functional_groupnorm(fn)

    def run(case: Case, t: TorchInputs):
        out = base(case, t)
        out["_path"] = last_backward_path()
        return out

    return run


def torch_path(case: Case) -> str:
    """torch's rule (seeds/000): parallel over N·G when HxW < 2048, whatever the thread count."""
    s = "groups" if prod(case.shape[2:]) < DEFAULT_THRESHOLD else "pixels"
    return "torch:" + path_name(s, case.affine, True, TORCH_DTYPES[case.dtype], len(case.shape))


def _torch(run):
    def runner(case: Case, t: TorchInputs):
        out = run(case, t)
        out["_path"] = torch_path(case)
        return out

    return runner


_TORCH_GN_ISSUES = (GN_CHANNELS_LAST_VARIANCE, GN_MIXED_MOMENTS, GN_F16_OVERFLOW)


def _make() -> list[Impl]:
    impls = []
    for strategy in ("auto", "groups", "pixels"):
        for n in THREADS:
            impls.append(Impl(f"cl-{strategy}-t{n}", "groupnorm",
                              f"normcheck's channels-last GroupNorm kernel, strategy {strategy}, {n} thread(s)",
                              ours(strategy, n), supports=supports, capabilities=CAPABILITIES))
    for n in THREADS:
        impls.append(Impl(f"torch-cl-t{n}", "groupnorm",
                          f"torch.nn.functional.group_norm through autograd, {n} thread(s)",
                          _torch(_with_threads(functional_groupnorm(F.group_norm), n)), supports=supports,
                          capabilities=CAPABILITIES, known_issues=_TORCH_GN_ISSUES))
        impls.append(Impl(f"torch-native-cl-t{n}", "groupnorm",
                          f"aten.native_group_norm + aten.native_group_norm_backward called directly, {n} thread(s)",
                          _torch(_with_threads(native_groupnorm_backward, n)), supports=supports,
                          capabilities=CAPABILITIES, known_issues=_TORCH_GN_ISSUES + (GN_NATIVE_DY_LAYOUT,)))
    return impls


IMPLS: list[Impl] = _make()
