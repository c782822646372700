"""normcheck's GroupNorm kernel for channels-last CPU tensors (forward and backward).

    from normcheck.kernels.groupnorm import group_norm, last_backward_path
    y = group_norm(x, num_groups, weight, bias, eps, strategy="auto", threshold=2048, threads=None)

* x: 4-D ``torch.channels_last`` or 5-D ``torch.channels_last_3d`` CPU tensor, dtype f32 or f64, or
  f16/bf16 (statistics and arithmetic in f32) with γ/β in f32 ("mixed") or in x's dtype.
* strategy: "groups" (parallel over N·G), "pixels" (parallel over N·HxW with per-thread partial
  sums), or "auto": "groups" when HxW < threshold (torch's rule, threshold 2048) and there are at
  least as many (n, g) sets as threads, else "pixels" (strategy 1 cannot use more threads than sets).
* threads: the thread count for this call (torch.set_num_threads is set around the kernel call
  and restored); None uses torch.get_num_threads().
* Differentiable: backward computes only what autograd asks for (dx, dγ, dβ each optional).
  dy in another memory format than x is converted to x's format first.
* ``last_backward_path()`` / ``last_forward_path()``: "strategy/gamma|nogamma/dx|nodx/mixed|plain/2d|3d"
  of the last call (mixed: f16/bf16 data accumulated in f32; plain: f32/f64).

Bad input (not channels-last, not 4-D/5-D, C not divisible by G, an unsupported dtype or dtype
combination, not on the CPU) raises ValueError naming what it got, before any work.
"""
from __future__ import annotations


import torch

from ...frameworks.torch import accumulation_dtype, describe_layout, with_threads
from .loader import BuildError, load

__all__ = [
    "DEFAULT_THRESHOLD",
    "STRATEGIES",
    "BuildError",
    "backward",
    "forward",
    "group_norm",
    "last_backward_path",
    "last_forward_path",
    "path_name",
    "validate",
]

DEFAULT_THRESHOLD = 2048
STRATEGIES = ("auto", "groups", "pixels")
_DATA = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
_last = {"forward": None, "backward": None}


def param_dtype_name(x_dtype: torch.dtype | None, weight_dtype: torch.dtype | None) -> str:
    """The parameters' dtype name: the weight's, else the accumulation dtype of x's data."""
    if weight_dtype is not None:
        return _DATA.get(weight_dtype, str(weight_dtype))
    return _DATA[accumulation_dtype(x_dtype)] if x_dtype in _DATA else str(x_dtype)


def validate_layout(shape, dtype: torch.dtype, is_channels_last: bool, fmt: str, device: str, num_groups: int,
                    param_dtypes=()) -> str | None:
    """Why the kernel cannot take this input (one line), or None.  Shared by the kernel and Impl.supports."""
    shape = tuple(shape)
    if device != "cpu":
        return f"x is on {device}; the kernel runs on the CPU only"
    if len(shape) not in (4, 5):
        return f"x is {len(shape)}-D {tuple(shape)}; the kernel takes 4-D (channels_last) or 5-D (channels_last_3d)"
    if not is_channels_last:
        want = "channels_last" if len(shape) == 4 else "channels_last_3d"
        return f"x is {fmt}; the kernel needs {want} for a {len(shape)}-D input"
    if dtype not in _DATA:
        return f"x has dtype {dtype}; supported: float32, float64, float16, bfloat16"
    if not isinstance(num_groups, int) or num_groups < 1 or shape[1] % num_groups:
        return f"C={shape[1]} is not divisible by num_groups={num_groups}"
    for name, pd in param_dtypes:
        if pd is None:
            continue
        ok = pd == dtype or (pd == torch.float32 and dtype in (torch.float16, torch.bfloat16))
        if not ok:
            return f"{name} has dtype {pd} with x {dtype}; supported: the same dtype, or float32 with float16/bfloat16 x"
    dts = {pd for _, pd in param_dtypes if pd is not None}
    if len(dts) > 1:
        return f"weight and bias have different dtypes {sorted(map(str, dts))}"
    return None


_CL_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}
_HALF = (torch.float16, torch.bfloat16)


def validate(x: torch.Tensor, num_groups: int, weight=None, bias=None) -> None:
    """Raise ValueError if the kernel cannot take these tensors."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x is a {type(x).__name__}, expected a torch.Tensor")  # noqa: TRY004 (API: ValueError)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and not isinstance(p, torch.Tensor):
            raise ValueError(f"{name} is a {type(p).__name__}, expected a torch.Tensor or None")
    cl = x.dim() in _CL_FORMATS and x.is_contiguous(memory_format=_CL_FORMATS[x.dim()])
    why = validate_layout(x.shape, x.dtype, cl, describe_layout(x) if x.dim() else "a scalar", x.device.type, num_groups,
                          [("weight", None if weight is None else weight.dtype),
                           ("bias", None if bias is None else bias.dtype)])
    if why:
        raise ValueError(why)
    c = x.shape[1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (tuple(p.shape) != (c,) or p.device.type != "cpu"):
            raise ValueError(f"{name} has shape {tuple(p.shape)} on {p.device.type}; expected ({c},) on cpu")


def path_name(strategy: str, gamma: bool, dx: bool, x_dtype: torch.dtype, ndim: int, with_dx: bool = True) -> str:
    """"strategy/gamma|nogamma/dx|nodx/mixed|plain/2d|3d" (the forward's has no dx part)."""
    mixed = "mixed" if x_dtype in _HALF else "plain"
    parts = [strategy, "gamma" if gamma else "nogamma"] + (["dx" if dx else "nodx"] if with_dx else [])
    return "/".join(parts + [mixed, f"{ndim - 2}d"])


def last_backward_path() -> str | None:
    return _last["backward"] and path_name(*_last["backward"])


def last_forward_path() -> str | None:
    return _last["forward"] and path_name(*_last["forward"], with_dx=False)


def _thread_count(n: int | None) -> int:
    if n is None:
        return torch.get_num_threads()
    if type(n) is not int or n < 1:
        raise ValueError(f"threads is {n!r}; expected a positive int or None")
    return n


_CODES = {"auto": 0, "groups": 1, "pixels": 2}
_NAMES = {1: "groups", 2: "pixels"}


def _code(strategy: str) -> int:
    code = _CODES.get(strategy)
    if code is None:
        raise ValueError(f"strategy is {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return code


def _explain(error: Exception, x, num_groups, weight, bias=None):
    """The kernel refused its input (a terse ValueError, or pybind's TypeError for a non-tensor):
    raise the detailed one-line ValueError of `validate`, or the kernel's own when validate finds nothing."""
    validate(x, num_groups, weight, bias)
    if isinstance(error, TypeError):
        raise ValueError(str(error).splitlines()[0]) from None
    raise error


# The Python side of a call is kept to a few attribute reads: on 50 µs tensors it was a third of the time.
def forward(x, num_groups, weight=None, bias=None, eps=1e-5, *, strategy="auto", threshold=DEFAULT_THRESHOLD,
            threads=None):
    """(y, mean, rstd) without autograd; mean/rstd are float64 (N, G) (values rounded to the f32 accumulator for
    non-f64 data)."""
    n = _thread_count(threads)
    pd = param_dtype_name(getattr(x, "dtype", None), getattr(weight if weight is not None else bias, "dtype", None))
    try:
        y, mean, rstd, used = with_threads(n, load().forward, x, weight, bias, num_groups, float(eps), _code(strategy),
                                    threshold, n, pd)
    except (ValueError, TypeError) as e:
        _explain(e, x, num_groups, weight, bias)
    _last["forward"] = (_NAMES[used], weight is not None, True, x.dtype, x.dim())
    return y, mean, rstd


def backward(dy, x, mean, rstd, num_groups, weight=None, *, need=(True, True, True), strategy="auto",
             threshold=DEFAULT_THRESHOLD, threads=None, param_dtype: str | None = None):
    """(dx, dweight, dbias), None where `need` says not requested.  dy in another memory format than x is
    converted to x's first (pytorch#92166: a kernel must never read dy with x's strides)."""
    n = _thread_count(threads)
    pd = param_dtype or param_dtype_name(getattr(x, "dtype", None), getattr(weight, "dtype", None))
    need_dx, need_dw, need_db = need
    try:
        dx, dw, db, used = with_threads(n, load().backward, dy, x, mean, rstd, weight, num_groups, _code(strategy),
                                 threshold, n, bool(need_dx), bool(need_dw), bool(need_db), pd)
    except (ValueError, TypeError) as e:
        if isinstance(x, torch.Tensor) and isinstance(dy, torch.Tensor) and (dy.shape != x.shape
                                                                             or dy.dtype != x.dtype):
            raise ValueError(f"dy is {tuple(dy.shape)} {dy.dtype}; expected shape {tuple(x.shape)} "
                             f"and dtype {x.dtype}") from None
        _explain(e, x, num_groups, weight)
    _last["backward"] = (_NAMES[used], weight is not None, bool(need_dx), x.dtype, x.dim())
    return dx, dw, db


class _GroupNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps, strategy, threshold, threads):
        y, mean, rstd = forward(x, num_groups, weight, bias, eps, strategy=strategy, threshold=threshold,
                                threads=threads)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.opts = (num_groups, strategy, threshold, threads,
                    param_dtype_name(x.dtype, weight.dtype if weight is not None else
                                     bias.dtype if bias is not None else None))
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        num_groups, strategy, threshold, threads, pd = ctx.opts
        need = ctx.needs_input_grad[:3]
        if not any(need):
            return (None,) * 8
        dx, dw, db = backward(dy, x, mean, rstd, num_groups, weight, need=need, strategy=strategy,
                              threshold=threshold, threads=threads, param_dtype=pd)
        return dx, dw, db, None, None, None, None, None


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, *, strategy="auto", threshold=DEFAULT_THRESHOLD,
               threads=None):
    """GroupNorm of a channels-last CPU tensor with normcheck's kernel; differentiable."""
    return _GroupNorm.apply(x, weight, bias, num_groups, eps, strategy, threshold, threads)
