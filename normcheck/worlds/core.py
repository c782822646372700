"""The World record: where the ranks of a case run, its size limits and device; and what every
distributed world shares (assembling the ranks' outputs; the time limits live in limits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.errors import ImplError, UsageError
from ..numerics.dtypes import quantise
from ..ops.layouts import SHARDED
from .limits import DEFAULT_TIMEOUT, CaseLimit, positive_seconds  # noqa: F401 - shared by every world

RankOutputs = dict[str, "np.ndarray | None"]  # one rank's float64 outputs (framework adapters' run_rank)


@dataclass(frozen=True)
class World:
    """`run(impl, case, inputs, limit) -> (outputs, path, ops)` runs one case of `impl` here, under
    the run's CaseLimit (`limit.run(case, work)` times the case itself, start-up excluded).

    distributed: it runs the ranks of a split case (False: the single-process ops' world);
    ranks: how ranks run ("process": this one; "worker": one worker process it starts; "threads";
    "processes" it starts; "launcher": the
    processes a launcher started, this one among them); max_size: the largest world it can hold
    (None: the launcher decides); device: where the ranks' tensors live; available(): why this
    machine cannot host it (None: it can); frameworks: whose implementations it runs."""
    name: str
    description: str
    distributed: bool
    run: Callable
    ranks: str = "process"
    max_size: int | None = None
    device: str = "cpu"
    available: Callable[[], "str | None"] = lambda: None
    frameworks: tuple[str, ...] = ("torch",)  # the frameworks whose implementations it runs

    def check(self, case) -> None:
        """One-line UsageError when `case` cannot run in this world."""
        why = self.available()
        if why:
            raise UsageError(why)
        if self.distributed and self.max_size is not None and not 1 <= len(case.split) <= self.max_size:
            raise UsageError(f"world size {len(case.split)} is outside 1-{self.max_size} for the {self.name} backend")


def assemble(case, per_rank: list[RankOutputs]) -> dict[str, np.ndarray]:
    """The ranks' outputs as one, under the op's layout (ops.layouts): the x-shaped ones (y, dx, and the results and
    operand gradients the op declares x-shaped: add + norm's h and dresidual), where asked for, joined along the
    split axis; the parameter gradients joined (sharded parameters), taken from rank 0 once every rank is seen to
    hold the same full gradient (replicated ones the function reduces), or summed (a rank's None counts as zero) and
    rounded to their dtype; running stats from rank 0, plus `running_mean[rank r]` for every rank that disagrees
    with rank 0, so those are compared too."""
    op, layout = case.record, case.record.layout
    out = {name: np.concatenate([r[name] for r in per_rank], axis=layout.data_axis(per_rank[0][name].ndim))
           for name in op.x_shaped_outputs(case) if name in per_rank[0]}
    for name in ("dweight", "dbias"):
        if name not in case.grads:
            continue
        if layout.params == SHARDED:  # (an empty share's None is its empty slice)
            out[name] = np.concatenate([np.zeros(0) if r.get(name) is None else r[name] for r in per_rank])
        elif layout.reduced_by_function(case):
            out[name] = replicated(name, [r.get(name) for r in per_rank])
        elif present := [r[name] for r in per_rank if r.get(name) is not None]:
            out[name] = quantise(np.sum(present, axis=0), op.output_dtype(case, name))
    for name in ("running_mean", "running_var"):
        if name not in per_rank[0]:
            continue
        out[name] = per_rank[0][name]
        for rank, r in enumerate(per_rank[1:], start=1):
            if not np.array_equal(r.get(name), out[name]):
                out[f"{name}[rank {rank}]"] = r.get(name)
    return out


def replicated(name: str, grads: list["np.ndarray | None"]) -> np.ndarray:
    """The gradient of a replicated parameter that every rank must hold in full and bit for bit alike; ImplError
    naming the ranks that differ from the value most ranks hold (rank 0's when no value has a majority) and by how
    much."""
    groups: dict[bytes | None, list[int]] = {}
    for rank, g in enumerate(grads):
        groups.setdefault(None if g is None else g.tobytes(), []).append(rank)
    if len(groups) == 1:
        if grads[0] is None:
            raise ImplError(f"{name} is None on every rank: no gradient reaches that input")
        return grads[0]
    largest = max(groups.values(), key=lambda ranks: (len(ranks), -ranks[0]))
    agreed = largest if 2 * len(largest) > len(grads) else next(r for r in groups.values() if 0 in r)
    base = grads[agreed[0]]
    parts = []
    for rank, g in enumerate(grads):
        if rank in agreed:
            continue
        if g is None or base is None:
            parts.append(f"rank {rank} {'has none' if g is None else 'has one where they have none'}")
        else:
            with np.errstate(invalid="ignore"):
                parts.append(f"rank {rank} by up to {float(np.nanmax(np.abs(g - base), initial=0.0)):.3g}")
    held = f"rank{'s' if len(agreed) > 1 else ''} {', '.join(map(str, agreed))}"
    raise ImplError(f"{name} is not the same on every rank (a replicated parameter's gradient, reduced by the function "
                    f"under reduces_grads): it differs from {held}'s: {'; '.join(parts)}")


def distributed(run_ranks: Callable) -> Callable:
    """A World.run from `run_ranks(impl, case, inputs, limit) -> per-rank outputs`."""

    def run(impl, case, inputs, limit: CaseLimit):
        return assemble(case, run_ranks(impl, case, inputs, limit)), "", frozenset()

    return run
