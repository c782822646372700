"""Torch tensors for a case: dtypes, memory formats, devices, and the inputs an implementation sees."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from ...core.errors import UsageError
from ...numerics.dtypes import accumulation
from ...numerics.formats import FORMATS, PITCH, SIZE1_BASE, size1_strides, storage_offset

TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # (fp8: an output's dtype, never a case's)


def dtype_name(dtype: torch.dtype) -> str:
    for name, dt in TORCH_DTYPES.items():
        if dt == dtype:
            return name
    return str(dtype).replace("torch.", "")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype a correct kernel accumulates `dtype` data in (numerics.dtypes.accumulation)."""
    return TORCH_DTYPES[accumulation(dtype_name(dtype))]


_MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
                   "channels_last_3d": torch.channels_last_3d}


def lay_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """Return a tensor equal to contiguous `t` in the named layout (fresh storage, never aliases t)."""
    if name in _MEMORY_FORMATS:
        return t.clone(memory_format=_MEMORY_FORMATS[name])
    if name == "strided":
        # A genuine non-contiguous view: every other element of a buffer twice as wide in the last
        # dimension, with the channel axis moved outermost so no stride matches a standard format.
        wide = list(t.shape)
        wide[-1] *= 2
        perm = [1, 0] + list(range(2, t.dim()))
        buffer = torch.zeros([wide[i] for i in perm], dtype=t.dtype).permute(*_inverse(perm))
        view = buffer[..., ::2]
        view.copy_(t)
        return view
    if name == "transposed":  # dense, the last two dims swapped in memory
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    offset = storage_offset(name, t.element_size())
    if offset:  # contiguous strides, that many elements into its storage
        buffer = torch.zeros(t.numel() + offset, dtype=t.dtype)
        return buffer[offset:].view(t.shape).copy_(t)
    if name == "pitched":  # the first PITCH-th of each row of a buffer PITCH times as wide
        wide = torch.zeros(*t.shape[:-1], PITCH * t.shape[-1], dtype=t.dtype)
        return wide[..., :t.shape[-1]].copy_(t)
    if name in SIZE1_BASE:  # the base layout (fresh storage), every size-1 dim at a non-canonical stride
        base = lay_out(t, SIZE1_BASE[name])
        return base.as_strided(base.shape, size1_strides(tuple(base.shape), base.stride()), base.storage_offset())
    if name == "expanded":  # stride 0 along the batch: t must be the same for every sample
        if t.shape[0] and not bool((t == t[:1]).all()):
            raise ValueError("an expanded layout needs the same values for every sample")
        return t[:1].clone().expand(t.shape)
    raise UsageError(f"unknown memory format {name!r}; choose one of {', '.join(FORMATS)}")


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def describe_layout(t: torch.Tensor) -> str:
    """Name the layout a tensor actually has (for messages)."""
    if t.is_contiguous():
        name = "contiguous" if not t.storage_offset() else f"contiguous at storage offset {t.storage_offset()}"
        return name + _size1(t, torch.contiguous_format)
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last" + _size1(t, torch.channels_last)
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "channels_last_3d" + _size1(t, torch.channels_last_3d)
    return f"strided (strides {tuple(t.stride())})"


def _size1(t: torch.Tensor, fmt: torch.memory_format) -> str:
    """'' when t's strides are its format's canonical ones; else what its size-1 dims' strides are."""
    canonical = torch.empty(t.shape, device="meta").contiguous(memory_format=fmt).stride()
    if tuple(t.stride()) == tuple(canonical):
        return ""
    return f" with size-1 dims at non-canonical strides (strides {tuple(t.stride())})"


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of `t` on `device` with t's exact strides, even for a non-dense view (`.to` would
    make that one contiguous, and the strided case would not be what it says)."""
    if is_non_overlapping_and_dense_or_false(t) and not t.storage_offset():
        return t.to(device)  # keeps the strides of dense tensors (not a storage offset)
    storage = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())  # the whole buffer t views
    return storage.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def own_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in memory of their own, laid out exactly as t: its sizes, strides and storage offset in a copy of the
    whole storage t views (the elements before an offset, the padding a pitch or a stride leaves; a rank's share, the
    other ranks' rows), where `.clone()` or `t * 1` would make it dense. Not a view of anything: autograd lets code
    write it in place."""
    t = t.detach()
    storage = t.untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())


def device_missing(name: str) -> str | None:
    """Why this torch cannot hold a case's tensors on the device `name` (cpu, cuda, cuda:1, mps, xpu, ...), in a
    clause; None: it can. Asks the device's torch module (torch.cuda, torch.mps, ...) without initialising it."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        return "not a device torch names (a device type such as cpu, cuda, mps or xpu, with an optional :INDEX)"
    if device.type == "cpu":
        return None if device.index in (None, 0) else "torch has one cpu device (cpu or cpu:0)"
    if device.type == "meta":
        return "meta tensors hold no values to compare"
    title = {"cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}.get(device.type, device.type)
    module = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu, torch.mtia, ...
    is_available = getattr(module, "is_available", None)
    if is_available is None:
        return f"this torch ({torch.__version__}) has no {title} device"
    if not is_available():
        return (f"this torch ({torch.__version__}) has no {title} device (torch.{device.type}.is_available() is "
                f"False)")
    count = getattr(module, "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        n = count()
        return f"this machine has {n} {title} device{'s' if n != 1 else ''} (indices 0-{n - 1})"
    return None


def with_threads(threads: int | None, fn, *args):
    """fn(*args) with torch's intra-op pool at `threads` for the call (None: as it is)."""
    old = torch.get_num_threads()
    if threads is None or threads == old:
        return fn(*args)
    torch.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(old)


@dataclass
class TorchInputs:
    x: torch.Tensor
    dy: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    running_mean: torch.Tensor
    running_var: torch.Tensor
    ddx: torch.Tensor | None = None  # order 2: the cotangents of dx, dweight and dbias
    ddweight: torch.Tensor | None = None
    ddbias: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # the op's declared operands (Op.operands)
    # x as the implementation receives it (the adapter's `handed`): x's values in memory of their own and its exact
    # layout, which an in-place layer may overwrite; x itself stays the leaf the gradients are taken of. None: x is
    # handed as it is
    x_handed: torch.Tensor | None = None

    def guarded(self) -> dict[str, torch.Tensor]:
        """The tensors an implementation must not modify (dy and the declared cotangents are grad_outputs; x is handed
        over as x_handed, and stays the case's own)."""
        named = {"x": self.x, "dy": self.dy, "weight": self.weight, "bias": self.bias, **self.extra}
        return {k: v for k, v in named.items() if v is not None}

    def handed(self) -> dict[str, torch.Tensor]:
        """The inputs handed over in memory of their own, which the implementation may write (by name)."""
        return {} if self.x_handed is None else {"x": self.x_handed}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.guarded().items()}

    def modified_since(self, snap: dict[str, torch.Tensor]) -> list[str]:
        now = self.guarded()
        return [k for k, before in snap.items() if not _same_bits(now[k], before)]

    def overwritten(self) -> list[str]:
        """The inputs handed over whose bits now differ from the case's own: the implementation wrote them."""
        return [k for k, v in self.handed().items() if not _same_bits(v, getattr(self, k))]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's elements as the integers of their bits (a view: t's layout, no copy)."""
    return t.detach().view(_INTEGERS[t.element_size()])


_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b hold the same elements bit for bit (compared as the integers of their bits: one pass, NaNs and the
    sign of zero included)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(_bits(a), _bits(b)))


def torch_inputs(inputs, shard: tuple[tuple, tuple] | None = None, device: torch.device | None = None,
                 hand_over_x: bool = True) -> TorchInputs:
    """Fresh tensors (new storage on every call) in the case's dtypes and layouts from its NumPy
    master inputs; `shard`: one rank's (index into x and dy, index into γ and β), Case.rank_shard;
    `device`: where they live (same layout); `hand_over_x`: x is handed over in memory of its own (x_handed; False:
    the implementation gets the case's own x, as a direct record does)."""
    case = inputs.case
    dt, pdt = TORCH_DTYPES[case.dtype], TORCH_DTYPES[case.param_dtype]

    def param(a):
        if a is None:
            return None
        return _move(torch.from_numpy((a if shard is None else a[shard[1]]).copy()).to(pdt), device)  # (its own storage)

    def data(a, fmt, dtype=dt):
        t = lay_out(torch.from_numpy(np.ascontiguousarray(a)).to(dtype), fmt)
        return _move(t if shard is None else t[shard[0]].detach(), device)

    op = case.record

    def operand(o):  # x-shaped ones laid out as x (data) or dy (cotangents); others contiguous, whole
        dtype = TORCH_DTYPES[op.dtype_of(case, o.dtype)]
        if o.shape != "x":
            return _move(torch.from_numpy(inputs.extra[o.name].copy()).to(dtype), device)
        return data(inputs.extra[o.name], case.x_format if o.role == "input" else case.dy_format, dtype)

    extra = {o.name: operand(o) for o in op.operands_of(case)}

    x = data(inputs.x, case.x_format)
    return TorchInputs(
        x=x, dy=data(inputs.dy, case.dy_format), x_handed=own_copy(x) if hand_over_x else None,
        weight=param(inputs.weight), bias=param(inputs.bias),
        running_mean=param(inputs.running_mean), running_var=param(inputs.running_var),
        ddx=None if inputs.ddx is None else data(inputs.ddx, "contiguous"),
        ddweight=param(inputs.ddweight), ddbias=param(inputs.ddbias), extra=extra,
    )


def _move(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    return t if device is None else to_device(t, device)
