"""normcheck: are these normalization-layer gradients right, everywhere they will run?

Public API: compare(op, impl, case) -> Report, Case, the op and implementation registries.
"""
from .cases import Case
from .compare import Report, TensorReport, compare
from .errors import UsageError
from .ops import OPS, get_op
from .registry import IMPLS, Impl, list_impls, register, resolve_impl

__all__ = ["Case", "Report", "TensorReport", "compare", "UsageError", "OPS", "get_op", "IMPLS", "Impl",
           "list_impls", "register", "resolve_impl"]
