"""Where in a failing output the errors sit: its elements over their allowance, summarised per axis.

A report names the worst element; a bug on one path of a kernel shows as a pattern (the last tile's columns, one
channel block, every row of one rank), which says where to look. The allowance is the one the case was judged by
(engine.compare.yardsticks); each x-shaped output is read in its normalisation view (numerics.sets: samples or rows,
channels or groups, the values of a set, positions), a parameter's gradient per channel or column, and a distributed
case's rows or hidden slice per rank.
"""
from __future__ import annotations

import numpy as np

from ..cases import Case
from .compare import yardsticks
from .report import nan_as_inf
from .tolerance import CONSTANTS, Constants

RUNS_SHOWN = 4  # index runs listed per axis before "and N more"


def error_sites(case: Case, outputs: dict, constants: Constants = CONSTANTS) -> list[str]:
    """One line per output of `outputs` with elements over their allowance on `case`: 'y: 8 of 88 elements over
    budget: the row, columns 80..87 of 88'."""
    sticks = yardsticks(case, constants)
    lines = []
    for name, got in outputs.items():
        base = name.split("[")[0]  # ("running_mean[rank 2]" is judged like running_mean)
        if base not in sticks or np.shape(got) != sticks[base].ref.shape:
            continue
        over = nan_as_inf(sticks[base].ratios(got)) > 1
        if over.any():
            where = ", ".join(_axes(case, base, over) + _ranks(case, over))
            lines.append(f"{name}: {int(over.sum())} of {over.size} elements over budget" + (f": {where}" if where else ""))
    return lines


def _axes(case: Case, name: str, over: np.ndarray) -> list[str]:
    """Each named axis of the output `name` with its indices that hold an error."""
    if over.shape == tuple(case.shape):
        names = _set_axes(case)
        grouped = case.view.group(over)
        return [_indices(grouped.any(axis=tuple(a for a in range(4) if a != axis)), names[axis])
                for axis in range(4) if grouped.shape[axis] > 1]
    if over.size <= 1:  # (a scalar: amax, ScaleNorm's one gain)
        return []
    if name in case.record.saved_stats:  # one value per set
        return [_indices(over.reshape(-1), ("set", "sets"))]
    # dγ, dβ, running statistics: one value per column (LayerNorm-like) or channel
    return [_indices(over.reshape(-1), ("column", "columns") if case.record.unit == "layer" else ("channel", "channels"))]


def _set_axes(case: Case) -> list[tuple[str, str]]:
    """(singular, plural) names of the grouped view's axes (N, K, L, S) of the op's sets."""
    view, unit = case.view, case.record.unit
    rows = unit == "layer" and view.s_in_sets  # LayerNorm-like over the last dims: N is the rows
    return [("row", "rows") if rows else ("sample", "samples"),
            ("group", "groups") if unit == "group" else ("channel", "channels"),
            ("channel in each group", "channels in each group") if unit == "group" else ("column", "columns"),
            ("position", "positions")]


def _ranks(case: Case, over: np.ndarray) -> list[str]:
    """The ranks whose share of a split case's x-shaped output holds an error."""
    if case.split is None or len(case.split) < 2 or over.shape != tuple(case.shape):
        return []
    layout = case.record.layout
    along = over.any(axis=tuple(a for a in range(over.ndim) if a != layout.data_axis(over.ndim)))
    ranks = sorted({layout.rank_of(case.split, (int(i),)) for i in np.flatnonzero(along)})
    return [_indices(np.isin(np.arange(len(case.split)), ranks), ("rank", "ranks"))]


def _indices(hit: np.ndarray, name: tuple[str, str]) -> str:
    """'columns 80..87 of 88', 'every row (of 16)', 'the channel' (an axis of one), 'rows 0, 3..5 of 7'."""
    singular, plural = name
    if hit.size == 1:
        return f"the {singular}"
    if hit.all():
        return f"every {singular} (of {hit.size})"
    runs = _runs(np.flatnonzero(hit))
    shown = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:RUNS_SHOWN])
    more = f" and {len(runs) - RUNS_SHOWN} more runs" if len(runs) > RUNS_SHOWN else ""
    return f"{singular if len(runs) == 1 and runs[0][0] == runs[0][1] else plural} {shown}{more} of {hit.size}"


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Sorted indices as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for i in map(int, indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs
