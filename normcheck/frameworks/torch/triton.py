"""Triton kernels in torch code: judged on a CPU through Triton's interpreter (--triton-interpret), and one clear
line when one is launched where Triton has no driver.

@triton.jit decides when it decorates a kernel whether the kernel is interpreted (TRITON_INTERPRET=1), so the
variable is set in the worker process that runs the implementation, before the implementation's module is imported
there (`interpret_here`, which the isolated world's workers for such a run call first); never in this process nor in
the fork server.

What the interpreter cannot run, measured with triton 3.9.0 against torch's own conversions and F.layer_norm:
* bf16: values are held as raw uint16 bits and arithmetic works on the bits (x·x + x of 0.3 gives 4e-8); the
  conversions to and from float32 are right, but normcheck cannot tell a kernel that only converts from one that
  computes, so bf16 cases are SKIP rows. f16, f32 and f64 arithmetic is NumPy's, right.
* fp8 outputs: the conversion to float8 (e4m3, e5m2) rounds a value just below a power of two down to the power
  below (7.93 -> 4.0) and ties away from zero (12.5 -> 13), 2.5-6 % of a normal sample's values: fp8 cases are SKIP
  rows.
* triton.language.extra.libdevice: every function is an empty stub there, so a kernel calling one (libdevice.rsqrt)
  raises "cannot convert None" on every case; tl.rsqrt, tl.sqrt and 1.0 / tl.sqrt run.
* float scalar arguments stay Python floats: f32 arithmetic rounds them as a GPU does, but in f64 arithmetic eps is
  the exact double where a compiled kernel gets it rounded to float32.
"""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from typing import Any, Callable

from ...core.text import raised_at

NO_INTERPRETER_DTYPES = ("bf16",)
# The interpreter runs every program in Python, hundreds of times slower than a GPU: its sweep keeps every level
# and pair of levels with cases a twelfth the size of the design's bounds (about 100,000 elements, which it runs
# in seconds), the large levels with smaller companions (cases.narrowing.Narrowing.element_scale)
INTERPRETER_ELEMENT_SCALE = 1 / 12


def triton_version() -> str | None:
    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def interpreter_missing() -> str | None:
    """Why --triton-interpret cannot run here (triton is not installed), in one line; None: it can."""
    if find_spec("triton") is None:
        return '--triton-interpret needs triton: pip install -e ".[triton]" (or pip install "normcheck[triton]")'
    return None


def interpret_here() -> None:
    """Switch Triton's interpreter on in this (worker) process, before the implementation is imported. triton itself
    is imported again: the fork server imported it with torch._dynamo, and triton.language's own @jit functions (tl.sum,
    tl.max, ...) were decorated then, compiled, which an interpreted kernel cannot call. (Its C extension, which does
    not read the variable, stays.)"""
    os.environ["TRITON_INTERPRET"] = "1"
    stale = [n for n in sys.modules if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")]
    for name in stale:
        del sys.modules[name]


def interpreter_gap(case) -> str | None:
    """Why Triton's interpreter cannot judge `case` (None: it can): a bf16 tensor anywhere, or an fp8 output."""
    op = case.record
    dtypes = {case.dtype, case.param_dtype, *(op.dtype_of(case, o.dtype) for o in op.operands_of(case))}
    where = f"Triton's interpreter (triton {triton_version()})"
    as_bits = sorted(dtypes & set(NO_INTERPRETER_DTYPES))
    if as_bits:
        return (f"{where} holds {as_bits[0]} values as raw bits and computes on the bits: a {as_bits[0]} case cannot "
                "tell the kernel's error from the interpreter's")
    if getattr(case, "fp8", None):
        return f"{where} rounds wrongly when it converts to fp8 (7.93 -> 4.0 in e4m3)"
    return None


@dataclass(frozen=True)
class Interpreted:
    """An implementation's own support rule (`own`), and what Triton's interpreter cannot run: the bound record's
    `supports` under --triton-interpret (ops.core.Bound), so its gaps are SKIP rows like any unsupported case; its
    record keeps its own rule, which binding again without the interpreter takes."""
    own: Callable[[Any], "str | None"]

    def __call__(self, case) -> str | None:
        return self.own(case) or interpreter_gap(case)


def no_driver(e: BaseException) -> str | None:
    """The row's one line when the implementation launched a Triton kernel where Triton found no driver (a machine
    without a GPU, the interpreter off); None for any other exception."""
    frames = traceback.extract_tb(e.__traceback__)
    launched_by_triton = frames and f"{os.sep}triton{os.sep}runtime{os.sep}" in frames[-1].filename
    if not (isinstance(e, RuntimeError) and launched_by_triton and "active drivers" in str(e)):
        return None
    return (f"launched a Triton kernel{raised_at(e)} but triton {triton_version()} has no driver here (no GPU): "
            "judge it on the CPU with --triton-interpret (Triton's interpreter), or on a GPU with --device cuda")
