"""Cases: one fully specified problem (Case), the inputs it makes (CaseInputs), replay tokens, the
default sweep and hypothesis strategies. NumPy only: frameworks lay the inputs out."""
from .case import Case, CaseInputs

__all__ = ["Case", "CaseInputs"]
