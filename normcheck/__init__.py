"""normcheck: are these normalization-layer gradients right, everywhere they will run?

Public API: compare(op, impl, case) -> Report, Case, the op and implementation catalogues.
Layers and catalogues: docs/architecture.md.

The names below are imported on first use (`from normcheck import compare` works as usual), so
`import normcheck.core...` stays light: the command line starts its worker processes' fork server
before this process imports torch.
"""
from importlib import import_module

_PUBLIC = {
    "Case": ".cases", "UsageError": ".core.errors", "Unsupported": ".core.errors", "Report": ".engine", "TensorReport": ".engine",
    "IMPLS": ".impls", "compare": ".impls", "list_impls": ".impls", "register": ".impls", "resolve_impl": ".impls",
    "OPS": ".ops", "Impl": ".ops", "get_op": ".ops", "WORLDS": ".worlds",
}

__all__ = ["Case", "Report", "TensorReport", "compare", "UsageError", "Unsupported", "OPS", "get_op", "IMPLS", "Impl",
           "list_impls", "register", "resolve_impl", "WORLDS"]


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(import_module(_PUBLIC[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'normcheck' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
