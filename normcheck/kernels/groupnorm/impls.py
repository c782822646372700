"""Registered GroupNorm implementations: normcheck's channels-last kernel and torch, at 1/2/3 threads.

``IMPLS`` (op "groupnorm"):
* ``cl-{auto,groups,pixels}-t{1,2,3}``: normcheck's kernel through autograd, strategy forced or automatic.
* ``torch-cl-t{1,2,3}``: torch.nn.functional.group_norm through autograd.
* ``torch-native-cl-t{1,2,3}``: aten.native_group_norm + aten.native_group_norm_backward called directly.

Every record reports a path: for ours the path the backward took (strategy/gamma/dx/mixed/2d); for torch
the path torch's rules predict from the case ("torch:" + groups when HxW < 2048 else pixels, ...).
The torch ones are restricted to the cases ours takes, so the rows line up.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

import torch

from ...frameworks.torch import TORCH_DTYPES
from ...numerics.formats import CHANNELS_LAST, FORMAT_RANK, base_format
from ...ops import Impl
from ...ops.groupnorm import OP as GROUPNORM
from . import DEFAULT_THRESHOLD, group_norm, last_backward_path, load, path_name, validate_layout

THREADS = (1, 2, 3)
_CL_FORMAT = {rank: name for name, rank in FORMAT_RANK.items() if name in CHANNELS_LAST}  # (standard ones)
CAPABILITIES = ("x 4-D channels_last or 5-D channels_last_3d (any dy format: converted); f64, f32, f16, bf16, "
                "mixed-f16, mixed-bf16")


def supports(case) -> str | None:
    """The kernel's own validation, applied to the case's shape, dtypes and x layout."""
    rank = len(case.shape)
    fmt = base_format(case.x_format)  # (torch reads no stride of a size-1 dim: its layout is its base format's)
    is_cl = _CL_FORMAT.get(rank) == fmt or (fmt == "contiguous" and rank in (4, 5) and _ambiguous(case.shape))
    pd = TORCH_DTYPES[case.param_dtype]
    return validate_layout(case.shape, TORCH_DTYPES[case.dtype], is_cl, fmt, "cpu", case.groups,
                           [("weight", pd if case.has_weight else None), ("bias", pd if case.has_bias else None)])


def _ambiguous(shape) -> bool:
    """A contiguous tensor that is channels-last too (C == 1 or one pixel)."""
    t = torch.empty(shape, device="meta")
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return t.is_contiguous(memory_format=fmt)


def ours(strategy: str, threads: int, threshold: int = DEFAULT_THRESHOLD):
    """normcheck's kernel with the group_norm contract, strategy and threads fixed."""

    def fn(x, groups, weight, bias, eps):
        return group_norm(x, groups, weight, bias, eps, strategy=strategy, threshold=threshold, threads=threads)

    fn.__qualname__ = f"ours_{strategy}_t{threads}"
    return fn


def torch_path(case) -> str:
    """torch's rule (seeds/000): parallel over N·G when HxW < 2048, whatever the thread count."""
    s = "groups" if prod(case.shape[2:]) < DEFAULT_THRESHOLD else "pixels"
    return "torch:" + path_name(s, case.affine, True, TORCH_DTYPES[case.dtype], len(case.shape))


def _make() -> list[Impl]:
    impls = []
    for strategy in ("auto", "groups", "pixels"):
        for n in THREADS:
            impls.append(Impl(f"cl-{strategy}-t{n}", "groupnorm",
                              f"normcheck's channels-last GroupNorm kernel, strategy {strategy}, {n} thread(s)",
                              ours(strategy, n), supports=supports, capabilities=CAPABILITIES,
                              path=lambda case: last_backward_path(), prepare=load,
                              orders=(1,)))  # its C++ backward has no derivative of its own
    torch_impls = {i.name: i for i in GROUPNORM.impls}
    for n in THREADS:
        for name, base in (("torch-cl", torch_impls["torch"]), ("torch-native-cl", torch_impls["torch-native-backward"])):
            impls.append(replace(base, name=f"{name}-t{n}", description=f"{base.description}, {n} thread(s)",
                                 supports=supports, capabilities=CAPABILITIES, threads=n, path=torch_path))
    return impls


IMPLS: list[Impl] = _make()
