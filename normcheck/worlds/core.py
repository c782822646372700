"""The World record: where the ranks of a case run, its size limits and device; and what every
distributed world shares (assembling the ranks' outputs; the time limits live in limits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.errors import UsageError
from ..numerics.dtypes import quantise
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
    """The ranks' outputs as one: y and dx (where asked for) concatenated over ranks; dweight/dbias summed (a rank's
    None counts as zero) and rounded to their dtype; running stats from rank 0, plus
    `running_mean[rank r]` for every rank that disagrees with rank 0, so those are compared too."""
    op = case.record
    out = {name: np.concatenate([r[name] for r in per_rank]) for name in ("y", "dx") if name in per_rank[0]}
    for name in ("dweight", "dbias"):
        present = [r[name] for r in per_rank if r.get(name) is not None]
        if name in case.grads and present:
            out[name] = quantise(np.sum(present, axis=0), op.output_dtype(case, name))
    for name in ("running_mean", "running_var"):
        if name not in per_rank[0]:
            continue
        out[name] = per_rank[0][name]
        for rank, r in enumerate(per_rank[1:], start=1):
            if not np.array_equal(r.get(name), out[name]):
                out[f"{name}[rank {rank}]"] = r.get(name)
    return out


def distributed(run_ranks: Callable) -> Callable:
    """A World.run from `run_ranks(impl, case, inputs, limit) -> per-rank outputs`."""

    def run(impl, case, inputs, limit: CaseLimit):
        return assemble(case, run_ranks(impl, case, inputs, limit)), "", frozenset()

    return run
