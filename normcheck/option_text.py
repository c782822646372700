"""Option text as Case values: what the front ends (the `normcheck` command, the pytest plugin) read from their
options, parsed here for both, so that the layers below take values, never text."""
from __future__ import annotations

from .cases.case import ORDERS
from .core.errors import UsageError
from .ops import CASE_FIELDS


def field_value(name: str, text: str):
    """The Case value of a fixable field or convention given as text (a pytest option): eps "none" is None,
    affine both/none are True/False, a shape or split a comma-separated list of integers, a world size one >= 1;
    UsageError for a number that is not one."""
    option = name.replace("_", "-")
    if name in ("shape", "split", "rank"):
        try:
            return tuple(int(v) for v in text.split(","))
        except ValueError:
            raise UsageError(f"{option} {text!r} is not a comma-separated list of integers") from None
    if name == "world_size":
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"{option} must be an integer >= 1, got {text!r}")
        return int(text)
    if name == "affine":
        return {"both": True, "none": False}.get(text, text)
    if name == "eps" and text.lower() == "none":
        return None
    if name in CASE_FIELDS:
        return CASE_FIELDS[name].value(text)
    if name == "order":
        return order_value(text)
    if name in ("eps", "momentum"):
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"{option} must be a number, got {text!r}") from None
    return text


def order_value(text: str):
    """An order given as text: 1 and 2 are numbers, the forward-mode ones names (Case.order)."""
    value = int(text) if text.strip().isdigit() else text.strip()
    if value not in ORDERS:
        raise UsageError(f"order must be one of {', '.join(map(str, ORDERS))}, got {text!r}")
    return value
