"""The implementation catalogue (IMPLS) and the public `compare`."""
from __future__ import annotations

from typing import Callable

from ..cases import Case
from ..engine import Report, judge
from ..engine.tolerance import CONSTANTS, Constants
from ..ops import Bound, Impl
from .catalogue import IMPLS, backend_of, bind, check_world, list_impls, register, resolve_impl, support_text, worlds_of


def compare(op: str, impl: str | Impl | Bound | Callable | None, case: Case, constants: Constants = CONSTANTS,
            device: str | None = None, triton_interpret: bool = False) -> Report:
    """Run `impl` (a registered name, module:attr, a function, an Impl or one bound already) on `case` and compare
    each output it produces with the float64 reference. `device`: where a torch implementation's tensors live
    (cpu when None; cuda, cuda:1, mps, ...: a device this torch lacks is a UsageError). `triton_interpret`: its
    Triton kernels run in Triton's interpreter, in its worker process (a case the interpreter cannot run is a SKIP)."""
    return judge(case, resolve_impl(op, impl, device=device, triton_interpret=triton_interpret), constants)


__all__ = ["IMPLS", "backend_of", "bind", "check_world", "compare", "list_impls", "register", "resolve_impl", "support_text",
           "worlds_of"]
