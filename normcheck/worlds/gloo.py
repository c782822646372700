"""The gloo world: real torch.distributed over gloo on 127.0.0.1, one persistent process per rank.

    with GlooWorld(3) as world:
        per_rank = world.run(Case("syncbn", (8, 4, 5, 5), dtype="f64", split=(3, 0, 5)), "my_syncbn:fn")

* One world per world size (``get_world`` keeps one per size for the process). A pool of the
  largest size with subgroups would share start-up cost between sizes, but a failure in any
  subgroup would leave the whole pool in an unknown state; per-size worlds fail and restart alone.
* The ranks are a WorkerPool (normcheck.worlds.workers: processes, rendezvous, failures, deadlock
  watch, clean shutdown); this module adds the case and spec checks and the per-size registry.
"""
from __future__ import annotations

import os
import threading

from ..cases import Case
from ..core.errors import UsageError
from ..core.loading import absolute_spec, load_callable
from .core import RankOutputs
from .limits import DEFAULT_TIMEOUT, CaseLimit, positive_seconds
from .workers import STARTUP_TIMEOUT, WorkerPool, WorldStartError, close_all

__all__ = ["DEFAULT_TIMEOUT", "GlooWorld", "WorldStartError", "close_all", "get_world", "run_gloo"]


class GlooWorld(WorkerPool):
    """`world_size` worker processes joined in a gloo process group, serving case after case."""

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT, *,
                 startup_timeout: float = STARTUP_TIMEOUT):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise UsageError(f"gloo world size must be a positive integer, got {world_size!r}")
        self.world_size = world_size
        self.kind = f"gloo world of size {world_size}"
        self._specs: dict[tuple[str, str], str] = {}
        super().__init__(world_size, timeout, group=True, startup_timeout=startup_timeout, name="gloo")

    @property
    def port(self) -> int | None:
        """The TCP port of this world's rendezvous store (None while no workers are running)."""
        w = self._workers
        return w.port if w else None

    def run(self, case: Case, impl_spec: str, timeout: CaseLimit | float | None = None) -> list[RankOutputs]:
        """Run `case` on every rank with the implementation `impl_spec` (``module:attr`` or
        ``path/to/file.py:attr``); the per-rank outputs in rank order. `timeout`: seconds, or the
        run's CaseLimit (None: this world's own timeout).

        Raises ImplError naming the rank(s) and the cause when a rank raises, returns bad outputs,
        dies or times out (the workers are then killed; the next call starts fresh ones), and
        UsageError for a case or spec this world cannot run.
        """
        if timeout is not None and not isinstance(timeout, CaseLimit):
            timeout = positive_seconds(timeout, "timeout")
        with self._lock:
            self._check_open()
            self._check_case(case)
            spec = self._checked_spec(impl_spec)
            return self.run_job(case, ("rank", spec), timeout, load=("load", spec))

    def __repr__(self) -> str:
        state = "closed" if self._closed else (f"port {self.port}, pids {self.pids}" if self._workers else "idle")
        return f"GlooWorld({self.world_size}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"this gloo world of size {self.world_size} is closed; use get_world() or a new GlooWorld")

    def _check_case(self, case: Case) -> None:
        if not isinstance(case, Case):
            raise UsageError(f"a gloo world runs a Case, got {type(case).__name__}")
        if case.split is None:
            raise UsageError(f"case {case.label} has no split: a gloo world needs per-rank batch sizes")
        if len(case.split) != self.world_size:
            raise UsageError(f"case split {case.split} is for {len(case.split)} ranks; this gloo world has "
                             f"{self.world_size}")

    def _checked_spec(self, spec: str) -> str:
        """Check in the parent that `spec` loads (a clear UsageError now instead of a failure on
        every rank); relative file paths are made absolute for the workers."""
        key = (os.getcwd(), spec)
        if key in self._specs:
            return self._specs[key]
        if not isinstance(spec, str):
            raise UsageError(f"a gloo world loads implementations by spec (module:attr or file.py:attr), "
                             f"got {type(spec).__name__}")
        resolved = absolute_spec(spec)
        load_callable(resolved)
        self._specs[key] = resolved
        return resolved


# ----------------------------------------------------------------------------- process-wide
_WORLDS: dict[int, GlooWorld] = {}
_WORLDS_LOCK = threading.Lock()


def get_world(world_size: int, timeout: float = DEFAULT_TIMEOUT) -> GlooWorld:
    """This process's world of `world_size` ranks (created on first use, kept open; a world whose
    workers were killed after a failure restarts them on its next run; a closed one is replaced).
    `timeout` becomes its default per-case timeout."""
    with _WORLDS_LOCK:
        world = _WORLDS.get(world_size)
        if world is None or world.closed:
            world = _WORLDS[world_size] = GlooWorld(world_size, timeout)
        else:
            world.timeout = positive_seconds(timeout, "timeout")
        return world


def run_gloo(case: Case, impl_spec: str, timeout: float = DEFAULT_TIMEOUT) -> list[RankOutputs]:
    """Run `case` in this process's gloo world of size len(case.split)."""
    if not isinstance(case, Case) or case.split is None:
        raise UsageError("a gloo world needs a Case with a split (per-rank batch sizes)")
    return get_world(len(case.split), timeout).run(case, impl_spec)


def gloo_ranks(bound, case: Case, inputs, limit: CaseLimit) -> list[RankOutputs]:
    """The gloo World's run_ranks: every rank makes the case's inputs itself from the case."""
    return get_world(len(case.split)).run(case, bound.impl.spec, limit)
