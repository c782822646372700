"""The five aten SyncBN primitives on normcheck's CUDA kernels, for torch CUDA tensors.

Each function has the aten signature and the semantics of
:mod:`normcheck.kernels.syncbn.cpu_primitives` (whose argument checks it shares); it lays the
tensors out as the kernels read them -- contiguous or channels-last, anything else made
contiguous -- and calls the ctypes launcher on torch's current stream of the input's device.

``register()`` installs them as the CUDA kernels of the aten ops (``torch.library``), in place of
torch's own, so torch's ``SyncBatchNorm`` Function and normcheck's recipes run on them;
``unregister()`` brings torch's back (the dispatcher keeps the kernel it overrode).
``using("normcheck" | "torch")`` chooses for the duration of a ``with`` block.  ``CALLS`` counts
the calls of each wrapper, so a test can tell whose kernels ran.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import warnings
from math import prod

import torch
from torch._prims_common import suggest_memory_format

from ....frameworks.torch import accumulation_dtype
from ..cpu_primitives import _check_input, _check_same_shape
from . import loader

__all__ = ["CALLS", "OPS", "batch_norm_backward_elemt", "batch_norm_backward_reduce", "batch_norm_elemt",
           "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts", "batch_norm_stats", "is_registered",
           "register", "unregister", "using"]

DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int32: 4,
               torch.int64: 5}
_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_STATS_JOB, _GRADS_JOB = 0, 1

CALLS: collections.Counter[str] = collections.Counter()


class KernelError(RuntimeError):
    """A launcher returned an error (a CUDA error, or arguments the kernels do not support)."""


def _check(op: str, code: int) -> None:
    if code != 0:
        raise KernelError(f"{op}: CUDA kernel failed: {loader.load().nc_error_string(code).decode()}")


def _on_cuda(op: str, *tensors: torch.Tensor | None) -> torch.device:
    first = next(t for t in tensors if t is not None)
    for t in tensors:
        if t is not None and t.device != first.device:
            raise RuntimeError(f"{op}: every tensor must be on {first.device}, got one on {t.device}")
    if first.device.type != "cuda":
        raise RuntimeError(f"{op}: normcheck's CUDA kernels take CUDA tensors, got {first.device}")
    return first.device


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _stream(device: torch.device) -> tuple[int, ctypes.c_void_p]:
    """The launchers' last two arguments: the device index and torch's current stream on it."""
    return device.index, ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _ptr(t: torch.Tensor | None) -> ctypes.c_void_p | None:
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _ncs(x: torch.Tensor) -> tuple[torch.Tensor, torch.memory_format, int, int, int]:
    """x in the memory format the outputs get (suggest_memory_format, as on CUDA) and its
    (n, c, s) description: contiguous -> (N, C, prod(spatial)), channels-last -> (N*prod(spatial), C, 1)."""
    fmt = suggest_memory_format(x)
    x = x.contiguous(memory_format=fmt)
    n, c, spatial = x.shape[0], x.shape[1], prod(x.shape[2:])
    if fmt == torch.contiguous_format:
        return x, fmt, n, c, spatial
    return x, fmt, n * spatial, c, 1


def _per_channel(op: str, t: torch.Tensor | None, c: int, name: str, dtype: torch.dtype) -> torch.Tensor | None:
    if t is None:
        return None
    if t.numel() != c:
        raise RuntimeError(f"{op}: {name} must have {c} elements (one per channel), got shape {tuple(t.shape)}")
    return t.reshape(c).to(dtype).contiguous()


def _param_dtype(x_dtype: torch.dtype, weight: torch.Tensor | None) -> torch.dtype:
    """The parameter dtype the kernels take: x's, or float32 for half/bfloat16 x (mixed precision).
    A weight in another dtype is converted to the accumulation dtype (as the CPU kernels do)."""
    if weight is None or weight.dtype == x_dtype or (x_dtype in _HALF and weight.dtype == torch.float32):
        return weight.dtype if weight is not None else x_dtype
    return accumulation_dtype(x_dtype)


def _workspace(job: int, x: torch.Tensor, n: int, c: int, s: int, sm: int) -> torch.Tensor | None:
    size = loader.load().nc_reduce_workspace_bytes(job, DTYPE_CODES[x.dtype], n, c, s, sm)
    return torch.empty(size, dtype=torch.uint8, device=x.device) if size else None


# --------------------------------------------------------------------------------------------- ops


def batch_norm_stats(input: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    op = "batch_norm_stats"
    CALLS[op] += 1
    c, _, _ = _check_input(op, input)
    device = _on_cuda(op, input)
    x, _, n, c, s = _ncs(input)
    acc = accumulation_dtype(x.dtype)
    mean = torch.empty(c, dtype=acc, device=device)
    invstd = torch.empty(c, dtype=acc, device=device)
    sm = _sm_count(device.index)
    ws = _workspace(_STATS_JOB, x, n, c, s, sm)
    _check(op, loader.load().nc_batch_norm_stats(
        DTYPE_CODES[x.dtype], _ptr(x), n, c, s, float(eps), _ptr(mean), _ptr(invstd), _ptr(ws),
        0 if ws is None else ws.numel(), sm, *_stream(device)))
    return mean, invstd


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    op = "batch_norm_gather_stats_with_counts"
    CALLS[op] += 1
    if mean.dim() != 2 or invstd.shape != mean.shape:
        raise RuntimeError(
            f"{op}: mean and invstd must both be (world_size, C), got {tuple(mean.shape)} and {tuple(invstd.shape)}")
    world, c = mean.shape
    if counts.numel() != world:
        raise RuntimeError(f"{op}: counts must have world_size = {world} elements, got shape {tuple(counts.shape)}")
    device = _on_cuda(op, mean, invstd, counts, running_mean, running_var)
    if mean.dtype not in _FLOATS or counts.dtype not in DTYPE_CODES:
        raise RuntimeError(f"{op}: unsupported dtypes: mean {mean.dtype}, counts {counts.dtype}")
    running = [t for t in (running_mean, running_var) if t is not None]
    if running and (any(t.dtype != running[0].dtype or t.numel() != c for t in running) or running[0].dtype not in _FLOATS):
        raise RuntimeError(f"{op}: running_mean and running_var must share one floating dtype and have {c} elements")
    out_dtype = torch.float32 if mean.dtype in _HALF else mean.dtype
    mean_r, invstd_r, counts_r = mean.contiguous(), invstd.to(mean.dtype).contiguous(), counts.contiguous()
    mean_out = torch.empty(c, dtype=out_dtype, device=device)
    invstd_out = torch.empty(c, dtype=out_dtype, device=device)
    # The kernel updates contiguous running stats in place; others through a contiguous copy.
    work = [None if t is None else (t if t.is_contiguous() else t.contiguous()) for t in (running_mean, running_var)]
    _check(op, loader.load().nc_batch_norm_gather_stats_with_counts(
        DTYPE_CODES[mean.dtype], _ptr(mean_r), _ptr(invstd_r), DTYPE_CODES[counts.dtype], _ptr(counts_r),
        world, c, DTYPE_CODES[running[0].dtype] if running else 0, _ptr(work[0]), _ptr(work[1]), float(momentum),
        float(eps), DTYPE_CODES[out_dtype], _ptr(mean_out), _ptr(invstd_out), *_stream(device)))
    for original, updated in zip((running_mean, running_var), work):
        if original is not None and updated is not original:
            original.copy_(updated)
    return mean_out, invstd_out



def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps, count):
    """The pre-1.6 signature: every rank has the same ``count``."""
    counts = torch.full((mean.shape[0] if mean.dim() else 0,), float(count), dtype=torch.float64, device=mean.device)
    return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    op = "batch_norm_elemt"
    CALLS[op] += 1
    c, _, _ = _check_input(op, input)
    device = _on_cuda(op, input, weight, bias, mean, invstd)
    x, fmt, n, c, s = _ncs(input)
    acc = accumulation_dtype(x.dtype)
    pdt = _param_dtype(x.dtype, weight if weight is not None else bias)
    w = _per_channel(op, weight, c, "weight", pdt)
    b = _per_channel(op, bias, c, "bias", pdt)
    m = _per_channel(op, mean, c, "mean", acc)
    istd = _per_channel(op, invstd, c, "invstd", acc)
    y = torch.empty_like(x, memory_format=fmt)
    _check(op, loader.load().nc_batch_norm_elemt(
        DTYPE_CODES[x.dtype], DTYPE_CODES[pdt], _ptr(x), _ptr(y), n, c, s, _ptr(w), _ptr(b), _ptr(m), _ptr(istd),
        _sm_count(device.index), *_stream(device)))
    return y


def batch_norm_elemt_out(input, weight, bias, mean, invstd, eps, *, out):
    result = batch_norm_elemt(input, weight, bias, mean, invstd, eps)
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    op = "batch_norm_backward_reduce"
    CALLS[op] += 1
    c, _, _ = _check_input(op, input)
    _check_same_shape(op, input, grad_out, "grad_out")
    device = _on_cuda(op, grad_out, input, mean, invstd, weight)
    x, fmt, n, c, s = _ncs(input)
    dy = grad_out.to(x.dtype).contiguous(memory_format=fmt)
    acc = accumulation_dtype(x.dtype)
    m = _per_channel(op, mean, c, "mean", acc)
    istd = _per_channel(op, invstd, c, "invstd", acc)
    if weight is not None and weight.numel() != c:
        raise RuntimeError(f"{op}: weight must have {c} elements, got shape {tuple(weight.shape)}")
    out_dtype = weight.dtype if weight is not None else x.dtype  # the CPU kernels' parameter dtype
    pdt = _param_dtype(x.dtype, weight)
    sums = torch.empty(2, c, dtype=acc, device=device) if input_g else None
    grad_weight = torch.empty(c, dtype=pdt, device=device) if weight_g else None
    grad_bias = torch.empty(c, dtype=pdt, device=device) if bias_g else None
    sm = _sm_count(device.index)
    ws = _workspace(_GRADS_JOB, x, n, c, s, sm)
    _check(op, loader.load().nc_batch_norm_backward_reduce(
        DTYPE_CODES[x.dtype], DTYPE_CODES[pdt], _ptr(dy), _ptr(x), n, c, s, _ptr(m), _ptr(istd),
        None if sums is None else _ptr(sums[0]), None if sums is None else _ptr(sums[1]), _ptr(grad_weight),
        _ptr(grad_bias), _ptr(ws), 0 if ws is None else ws.numel(), sm, *_stream(device)))
    if grad_weight is not None:
        grad_weight = grad_weight.to(out_dtype)
    if grad_bias is not None:
        grad_bias = grad_bias.to(out_dtype)
    sum_dy, sum_dy_xmu = (None, None) if sums is None else (sums[0], sums[1])
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    op = "batch_norm_backward_elemt"
    CALLS[op] += 1
    c, _, _ = _check_input(op, input)
    _check_same_shape(op, input, grad_out, "grad_out")
    if count.dtype != torch.int32:  # CUDA reads it as int*: "expected scalar type Int"
        raise RuntimeError(
            f"{op}: expected count (the per-rank element counts) to have scalar type Int (int32), got {count.dtype}")
    device = _on_cuda(op, grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
    x, fmt, n, c, s = _ncs(input)
    dy = grad_out.to(x.dtype).contiguous(memory_format=fmt)
    acc = accumulation_dtype(x.dtype)
    pdt = _param_dtype(x.dtype, weight)
    w = _per_channel(op, weight, c, "weight", pdt)
    tensors = [_per_channel(op, t, c, name, acc) for t, name in
               ((mean, "mean"), (invstd, "invstd"), (sum_dy, "sum_dy"), (sum_dy_xmu, "sum_dy_xmu"))]
    counts = count.contiguous()
    dx = torch.empty_like(x, memory_format=fmt)
    _check(op, loader.load().nc_batch_norm_backward_elemt(
        DTYPE_CODES[x.dtype], DTYPE_CODES[pdt], _ptr(dy), _ptr(x), _ptr(dx), n, c, s, _ptr(tensors[0]),
        _ptr(tensors[1]), _ptr(w), _ptr(tensors[2]), _ptr(tensors[3]), _ptr(counts), counts.numel(),
        _sm_count(device.index), *_stream(device)))
    return dx


# ------------------------------------------------------------------------------------ registration

OPS = {
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_gather_stats": batch_norm_gather_stats,
    "batch_norm_gather_stats_with_counts": batch_norm_gather_stats_with_counts,
    "batch_norm_elemt": batch_norm_elemt,
    "batch_norm_elemt.out": batch_norm_elemt_out,
    "batch_norm_backward_reduce": batch_norm_backward_reduce,
    "batch_norm_backward_elemt": batch_norm_backward_elemt,
}

_LIB: torch.library.Library | None = None


def register() -> None:
    """Make these the CUDA kernels of the aten SyncBN ops (idempotent).  Builds the library
    first, so a build error surfaces here and not inside a dispatch."""
    global _LIB
    if _LIB is not None:
        return
    loader.load()
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        for name, fn in OPS.items():
            lib.impl(name, fn, "CUDA")
    _LIB = lib


def unregister() -> None:
    """Give the CUDA dispatch key back to whatever kernels it had before register()."""
    global _LIB
    if _LIB is not None:
        _LIB._destroy()
        _LIB = None


def is_registered() -> bool:
    return _LIB is not None


@contextlib.contextmanager
def using(provider: str):
    """Run the block on "normcheck"'s CUDA primitives or on "torch"'s own; the previous choice
    is restored afterwards."""
    if provider not in ("normcheck", "torch"):
        raise ValueError(f"unknown CUDA primitives provider {provider!r}; choose normcheck or torch")
    before = is_registered()
    (register if provider == "normcheck" else unregister)()
    try:
        yield
    finally:
        (register if before else unregister)()
