"""Batch invariance: a row's outputs are bitwise the same whatever batch it is computed in.

For an op whose rows (dim 0: LayerNorm's and RMSNorm's leading rows, GroupNorm's and InstanceNorm's samples,
BatchNorm's in eval mode) are independent (Op.rows_depend says none), y, dx and the other x-shaped outputs of a row depend
on that row alone (and on γ, β and its dy). A kernel that picks its block size, split or reduction order from the
number of rows breaks that; a row of an inference batch then differs from the same prompt's at batch 1. The case's
rows are run again embedded in other batches (other rows drawn as the case draws its own): its first row alone, the
case among a few others at an offset, and a batch past the row and element counts kernels switch strategy at; their
x-shaped outputs must equal the case's run bit for bit. Parameter gradients sum over the rows: they are not checked.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..cases import Case
from ..core.errors import UsageError
from ..numerics.dtypes import UNIT_ROUNDOFF
from ..numerics.formats import DY_ONLY as SAME_FOR_EVERY_SAMPLE

LARGE_ROWS = 1024           # past the row counts kernels switch at (a block per row, split-K, persistent kernels)
LARGE_ELEMENTS = 1 << 20    # ... and the element counts
MOST_ELEMENTS = 1 << 21    # (a case already this large is embedded in few more rows)


@dataclass(frozen=True)
class Batch:
    """The case's first `count` rows (all of them, or its first alone) placed at `at` in a batch of `size` rows."""
    size: int
    at: int
    count: int

    @property
    def text(self) -> str:
        if self.size == 1:
            return "its first row alone (a batch of 1)"
        return f"its rows at {self.at} in a batch of {self.size}"


def batches(case: Case) -> list[Batch]:
    """The batches a case's rows are checked in: its first row alone, the case at 3 among 5 more rows, and the case
    last in a batch past LARGE_ROWS rows and LARGE_ELEMENTS elements (fewer where that would exceed MOST_ELEMENTS)."""
    rows = case.shape[0]
    per_row = max(1, int(np.prod(case.shape[1:])))
    large = max(LARGE_ROWS, -(-LARGE_ELEMENTS // per_row), rows + 1)
    large = max(rows + 1, min(large, MOST_ELEMENTS // per_row))
    return ([Batch(1, 0, 1)] if rows > 1 else []) + [Batch(rows + 5, 3, rows), Batch(large, large - rows, rows)]


def embedded(case: Case, inputs, batch: Batch):
    """(the batch's case, its inputs): its own rows drawn as the case draws them (another seed), the case's first
    `count` rows at `at` (x's tangent or cotangent, ddx, alike); the parameters, their directions, the running
    statistics and every input not batched along dim 0 (a scale) the case's own."""
    big = case.with_(shape=(batch.size,) + case.shape[1:], seed=case.seed + 1)
    others = big.make_inputs()
    rows = slice(0, batch.count)
    at = slice(batch.at, batch.at + batch.count)

    def place(mine, theirs):
        if mine is None or theirs is None or np.ndim(mine) == 0 or mine.shape[0] != case.shape[0] \
                or theirs.shape[1:] != mine.shape[1:]:
            return mine
        out = theirs.copy()
        out[at] = mine[rows]
        return out

    def cotangent(mine, theirs):  # laid out as dy: stride 0 along the batch gives every row the case's first one
        if case.dy_format in SAME_FOR_EVERY_SAMPLE:
            return np.broadcast_to(mine[:1], theirs.shape).copy()
        return place(mine, theirs)

    cotangents = {o.name for o in case.record.operands_of(case) if o.role == "cotangent" and o.shape == "x"}
    return big, replace(others, case=big, x=place(inputs.x, others.x), dy=cotangent(inputs.dy, others.dy),
                        weight=inputs.weight, bias=inputs.bias, running_mean=inputs.running_mean,
                        running_var=inputs.running_var, ddx=place(inputs.ddx, others.ddx),
                        ddweight=inputs.ddweight, ddbias=inputs.ddbias,
                        extra={k: (cotangent if k in cotangents else place)(v, others.extra.get(k))
                               for k, v in inputs.extra.items()})


def ulps(a: np.ndarray, b: np.ndarray, dtype: str) -> float:
    """The largest difference of a and b in units in the last place of `dtype` at b's largest magnitude (an element
    near zero by cancellation is measured on its tensor's scale, not its own)."""
    with np.errstate(invalid="ignore"):
        largest = float(np.nanmax(np.abs(b), initial=0.0)) or float(np.finfo(np.float64).tiny)
        spacing = 2 * UNIT_ROUNDOFF[dtype] * 2.0 ** np.floor(np.log2(largest))
        return float(np.nanmax(np.abs(a - b), initial=0.0)) / spacing


def difference(case: Case, outputs: dict, batch: Batch, theirs: dict) -> str | None:
    """What differs between the case's outputs and the batch's run of the same rows (None: every bit alike)."""
    op = case.record
    for name in op.x_shaped_outputs(case):
        if name not in outputs or name not in theirs:
            continue
        mine = outputs[name][:batch.count]
        got = theirs[name][batch.at:batch.at + batch.count]
        if np.array_equal(mine, got, equal_nan=True):
            continue
        rows = np.flatnonzero(~np.all((mine == got) | (np.isnan(mine) & np.isnan(got)),
                                      axis=tuple(range(1, mine.ndim))))
        return (f"not batch invariant: {name} of row {int(rows[0])} differs with {batch.text}"
                f" ({len(rows)} of {batch.count} rows differ, by up to {ulps(got, mine, op.output_dtype(case, name)):.3g}"
                f" ulps)")
    return None


def check(case: Case, impl, inputs, outputs: dict) -> str | None:
    """Run `impl` on the case's rows in each of its batches; the first difference found, or None."""
    for batch in batches(case):
        try:
            big, big_inputs = embedded(case, inputs, batch)
        except UsageError:  # a batch the op does not take (BatchNorm's single row): not one to check
            continue
        theirs = impl.runner(big, big_inputs)[0]
        found = difference(case, outputs, batch, theirs)
        if found:
            return found
    return None
