"""normcheck: are these normalization-layer gradients right, everywhere they will run?

Public API: compare(op, impl, case) -> Report, Case, the op and implementation catalogues.
Layers and catalogues: docs/architecture.md.
"""
from .cases import Case
from .core.errors import UsageError
from .engine import Report, TensorReport
from .impls import IMPLS, compare, list_impls, register, resolve_impl
from .ops import OPS, Impl, get_op
from .worlds import WORLDS

__all__ = ["Case", "Report", "TensorReport", "compare", "UsageError", "OPS", "get_op", "IMPLS", "Impl",
           "list_impls", "register", "resolve_impl", "WORLDS"]
