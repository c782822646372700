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

from dataclasses import dataclass, fields, replace

import numpy as np

from ..cases import Case, CaseInputs
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
    """(the batch's case, its inputs): the case's rows in turn fill the batch, its first `count` rows at `at` (x's
    tangent or cotangent, ddx, every operand batched along dim 0 alike); the parameters, their directions, the running
    statistics and every input not batched along dim 0 (a scale) the case's own. The other rows repeat the case's
    rather than being drawn: only the case's own rows are compared, and drawing a million values cost more than the
    run."""
    big = case.with_(shape=(batch.size,) + case.shape[1:])
    rows = slice(0, batch.count)
    at = slice(batch.at, batch.at + batch.count)

    def place(mine, cotangent: bool = False):
        if mine is None:
            return None
        if cotangent and case.dy_format in SAME_FOR_EVERY_SAMPLE:  # stride 0 along the batch: every row the first
            return np.broadcast_to(mine[:1], (batch.size,) + mine.shape[1:]).copy()
        out = np.resize(mine, (batch.size,) + mine.shape[1:])  # (row-major: the case's rows, repeated)
        out[at] = mine[rows]
        return out

    # An operand is batched when its declared shape follows the case's rows (x's, adaln's per-sample scale)
    batched = {o.name: o.role == "cotangent" and o.shape == "x" for o in case.record.operands_of(case)
               if o.shape == "x" or o.shape(big) != o.shape(case)}
    built = replace(inputs, case=big, x=place(inputs.x), dy=place(inputs.dy, cotangent=True), ddx=place(inputs.ddx),
                    extra={k: place(v, batched[k]) if k in batched else v for k, v in inputs.extra.items()})
    return big, EmbeddedInputs(**{f.name: getattr(built, f.name) for f in fields(built)}, made_from=(case, inputs, batch))


@dataclass(frozen=True)
class EmbeddedInputs(CaseInputs):
    """A batch's inputs that travel to a worker process as the case's own and the batch (the worker builds them
    again: a few milliseconds, where pickling a million float64 values both ways took most of the check's time)."""
    made_from: tuple = ()

    def __reduce__(self):
        return _embedded_inputs, self.made_from

    def kept(self, outputs: dict) -> dict:
        """The x-shaped outputs at the case's rows, the only ones the check compares (a run in a worker sends back
        those alone)."""
        case, _, batch = self.made_from
        rows = slice(batch.at, batch.at + batch.count)
        return {name: outputs[name][rows] for name in case.record.x_shaped_outputs(case) if name in outputs}


def _embedded_inputs(case: Case, inputs, batch: Batch) -> CaseInputs:
    return embedded(case, inputs, batch)[1]


def ulps(a: np.ndarray, b: np.ndarray, dtype: str) -> float:
    """The largest difference of a and b in units in the last place of `dtype` at b's largest magnitude (an element
    near zero by cancellation is measured on its tensor's scale, not its own)."""
    with np.errstate(invalid="ignore"):
        largest = float(np.nanmax(np.abs(b), initial=0.0)) or float(np.finfo(np.float64).tiny)
        spacing = 2 * UNIT_ROUNDOFF[dtype] * 2.0 ** np.floor(np.log2(largest))
        return float(np.nanmax(np.abs(a - b), initial=0.0)) / spacing


def difference(case: Case, outputs: dict, batch: Batch, theirs: dict) -> str | None:
    """What differs between the case's outputs and the batch's run of the same rows, `theirs` (None: every bit
    alike)."""
    op = case.record
    for name in op.x_shaped_outputs(case):
        if name not in outputs or name not in theirs:
            continue
        mine = outputs[name][:batch.count]
        got = theirs[name]  # (the batch's run keeps the case's rows alone: EmbeddedInputs.kept)
        if np.array_equal(mine, got, equal_nan=True):
            continue
        rows = np.flatnonzero(~np.all((mine == got) | (np.isnan(mine) & np.isnan(got)),
                                      axis=tuple(range(1, mine.ndim))))
        return (f"not batch invariant: {name} of row {int(rows[0])} differs with {batch.text}"
                f" ({len(rows)} of {batch.count} rows differ, by up to {ulps(got, mine, op.output_dtype(case, name)):.3g}"
                f" ulps)")
    return None


def check(case: Case, bound, inputs, outputs: dict, seconds: float) -> str | None:
    """Run the bound implementation on the case's rows in each of its batches; the first difference found, or None. `seconds`: the
    case's float64 reference time, which times each batch scaled to its size (a batch's own reference is never
    compared, so it is never computed)."""
    for batch in batches(case):
        try:
            big, big_inputs = embedded(case, inputs, batch)
        except UsageError:  # a batch the op does not take (BatchNorm's single row): not one to check
            continue
        if bound.limit is not None:
            bound.limit.expect(big, seconds * batch.size / case.shape[0])
        theirs = bound.runner(big, big_inputs)[0]
        found = difference(case, outputs, batch, theirs)
        if found:
            return found
    return None
