"""Whether an implementation that fails every case is a norm at all.

A layer none of normcheck's ops describes (DyT, γ·tanh(αx) + β in place of a LayerNorm) fails every case far beyond
any convention, and hundreds of FAIL rows say nothing its first few do not. What every op here computes, whatever its
conventions and however wrongly, is a statistic over each set: an element's y moves when the other elements of its
set do. So once the first PROBE_AFTER cases judged have all failed, each of them is run again (made float64,
training mode, normal data; its layout, shape, eps and parameters kept) with x scaled by SCALE at half of its elements,
drawn at random: where y at the other half has not moved (by more than float64's rounding: MOVED of y's size) in any
set that has elements of both halves, the implementation computes element by element, no statistic at all, and the
run stops with one line saying so. A wrong norm (a statistic formed wrongly or over the wrong set, a missing eps, a
stage in the wrong place) moves them, and gets its FAIL rows.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..cases import Case
from ..core.errors import UsageError
from ..ops import Bound
from .compare import case_inputs
from .report import FAIL, SKIP, Report

PROBE_AFTER = 3  # judged cases (SKIPs aside) that must all fail before the probe runs
SCALE = 4.0      # a power of two: x·SCALE is exact in float64 (normal data stays far from overflow)
MOVED = 1e-9     # of y's root mean square: float64's rounding, where a set's other elements moved by a factor of 4


def first_failures(reports: list[Report]) -> list[Report] | None:
    """The judged reports (SKIPs aside) as the PROBE_AFTER-th comes in, where they all failed (None otherwise): what
    the probes of a run's first failures read, once a run."""
    judged = [r for r in reports if r.verdict != SKIP]
    if not reports or reports[-1].verdict == SKIP or len(judged) != PROBE_AFTER or any(r.verdict != FAIL for r in judged):
        return None
    return judged


def no_norm(reports: list[Report], bound: Bound) -> str | None:
    """Why `bound` is not a norm of its op at all, once exactly PROBE_AFTER judged reports (SKIPs aside) are in and all
    failed (so the probe runs once a run): the first of their cases the probe can decide on says (None: it computes
    over its sets, or no case can say: sets of one element)."""
    judged = first_failures(reports)
    if judged is None or not all(r.tensors for r in judged):  # (a case that hung, died or raised has no y)
        return None
    return next((why for r in judged if (why := not_a_norm(r.case, bound))), None)


def not_a_norm(case: Case, bound: Bound) -> str | None:
    """Why `bound` is not a norm of `case`'s op at all (None: it computes over its sets, or the probe cannot say)."""
    op = case.record
    try:
        probe = case.with_(dtype="f64", param_dtype="f64", profile="normal", mode="train", order=1)
    except UsageError:
        return None
    if op.distributed or bound.unsupported(probe):
        return None
    inputs = case_inputs(probe)
    view = probe.view
    moved = np.random.default_rng(0).random(probe.shape) < 0.5  # (the half of x that is scaled)
    share = view.mean(view.group(moved.astype(np.float64)))
    if not np.any((share > 0) & (share < 1)):  # (sets of one element, say: a norm's y is element-wise there too)
        return None
    try:
        before = bound.runner(probe, inputs)[0].get("y")
        after = bound.runner(probe, replace(inputs, x=np.where(moved, inputs.x * SCALE, inputs.x)))[0].get("y")
    except Exception:  # noqa: BLE001 - whatever it raised on the probe (in this process: as raised), its rows say
        return None
    if before is None or after is None or before.shape != probe.shape or after.shape != probe.shape:
        return None
    with np.errstate(all="ignore"):
        size = float(np.sqrt(np.mean(np.square(before))))
        kept = float(np.max(np.abs(np.where(moved, 0.0, after - before)), initial=0.0))
    if not (np.isfinite(size) and np.isfinite(kept)) or size == 0 or kept > MOVED * size:
        return None
    return (f"{bound.name} is not a {op.name}: its y is element-wise, computed from each element alone (x × {SCALE:g} at "
            f"half of the elements of {probe.label} left y at the others as it was, where a norm's moves with its "
            f"set's statistic), which none of normcheck's ops describes; its first {PROBE_AFTER} cases failed")
