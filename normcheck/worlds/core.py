"""The World record: where the ranks of a case run, its size limits and device; and what every
distributed world shares (assembling the ranks' outputs; the time limits live in limits).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable, NamedTuple

import numpy as np

from ..core.errors import ImplError, UsageError
from ..numerics.dtypes import quantise
from ..ops.layouts import SHARDED
from .limits import DEFAULT_TIMEOUT, CaseLimit, positive_seconds  # noqa: F401 - shared by every world

MAX_WORLD_SIZE = 64  # the lockstep worlds' ranks (threads of this process)

RankOutputs = dict[str, "np.ndarray | None"]  # one rank's float64 outputs (framework adapters' run_rank)


class Run(NamedTuple):
    """What running a case gave: the first run's outputs, the path it took and the kernels it called; `differ`, the
    outputs whose bits a later run on the same inputs changed (a finding of its own: engine.compare)."""
    outputs: "dict | list"
    path: str
    ops: frozenset
    differ: tuple[str, ...] = ()


def repeated(once: Callable[[], tuple], runs: int, again: Callable[[object], tuple] | None = None) -> Run:
    """once() -> (outputs, path, ops), then the case `runs - 1` times more on the same inputs (twice in all for an
    implementation that says it is deterministic): the first run, and the outputs a later run gave other bits for.
    `again(first outputs)`: the names a later run changed, where something other than a run here makes it (a worker
    process that kept the case's inputs); by default once() again, compared here."""
    outputs, path, ops = once()
    again = again or (lambda first: differing(first, once()[0]))
    return Run(outputs, path, ops, tuple(dict.fromkeys(name for _ in range(runs - 1) for name in again(outputs))))


def differing(first: "dict | list", other: "dict | list") -> tuple[str, ...]:
    """The outputs whose bits differ between two runs (NaNs equal where both are NaN); outputs are a dict, or one
    dict per device or rank."""
    pairs = zip(first, other) if isinstance(first, list) else [(first, other)]
    return tuple(dict.fromkeys(name for a, b in pairs for name in a if not _same_bits(a[name], b.get(name))))


def _same_bits(a, b) -> bool:
    if a is None or b is None:  # (a rank's or device's absent gradient)
        return a is b
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


@dataclass(frozen=True)
class World:
    """`run(bound, case, inputs, limit, runs=1) -> Run` runs one case of a bound implementation (ops.Bound) here `runs`
    times on the same inputs,
    under the run's CaseLimit (`limit.run(case, work)` times the case itself, start-up excluded).

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


class Later:
    """A world's function named `module:attr`, imported on its first call: the catalogue (and with it the command
    line's --backend choices) loads no framework, so a run's arguments are checked before torch loads."""

    def __init__(self, spec: str):
        self.spec = spec

    def __call__(self, *args, **kwargs):
        module, _, attr = self.spec.partition(":")
        return getattr(import_module(module), attr)(*args, **kwargs)


def distributed(run_ranks: Callable) -> Callable:
    """A World.run from `run_ranks(bound, case, inputs, limit) -> per-rank outputs` (each run under the limit)."""

    def run(bound, case, inputs, limit: CaseLimit, runs: int = 1) -> Run:
        return repeated(lambda: (assemble(case, run_ranks(bound, case, inputs, limit)), "", frozenset()), runs)

    return run
