"""The lockstep world: every rank is a thread of this process; collectives meet at a barrier.

For recipes written against normcheck.kernels.syncbn.collectives (they take a LockstepGroup where
torch.distributed would take a ProcessGroup). Any world size from 1 to 64, empty ranks included.
A rank that raises, or never arrives at a collective within the timeout, fails the case with a
message naming it; the barrier is then broken so the other ranks stop waiting.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from ..cases import Case
from ..errors import UsageError
from ..runners import ImplError
from .rank import RankOutputs, run_rank

MAX_WORLD_SIZE = 64


class RankFailed(Exception):
    """Raised inside a rank whose peers gave up on the collective it was waiting in."""


class _Rendezvous:
    """Shared by the ranks of one case: a barrier, one slot per rank, and a shared dict."""

    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.barrier = threading.Barrier(size)
        self.slots: list[torch.Tensor | None] = [None] * size
        self.calls = [0] * size
        self.shared: dict = {}  # for recipes that exchange more than tensors (queues)

    def exchange(self, rank: int, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        self.calls[rank] += 1
        self.slots[rank] = tensor.detach().clone()
        self._wait(rank, what)
        everyone = list(self.slots)
        self._wait(rank, what)  # nobody overwrites a slot before every rank has read them all
        return everyone

    def _wait(self, rank: int, what: str) -> None:
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise RankFailed(f"gave up in {what} #{self.calls[rank]}") from None


class LockstepGroup:
    """What a recipe receives as `process_group` in the lockstep world."""

    def __init__(self, rendezvous: _Rendezvous, rank: int):
        self._rv = rendezvous
        self._rank = rank

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._rv.size

    @property
    def shared(self) -> dict:
        return self._rv.shared

    def simulated_all_reduce(self, tensor: torch.Tensor) -> None:
        parts = self._rv.exchange(self._rank, tensor, "all_reduce")
        # Summed in rank order in the tensor's dtype, like a ring all-reduce rounds per hop.
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        tensor.copy_(total)

    def simulated_all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._rv.exchange(self._rank, tensor, "all_gather"))

    def barrier(self) -> None:
        self._rv._wait(self._rank, "barrier")


def run_lockstep(case: Case, fn: Callable, timeout: float = 60.0,
                 device: torch.device | None = None) -> list[RankOutputs]:
    """Run `fn` on every rank of `case.split` as threads; per-rank outputs in rank order.

    `device`: where the ranks' tensors live (default: the CPU; e.g. one CUDA device for all ranks).
    Outputs come back on the CPU."""
    size = len(case.split)
    if not 1 <= size <= MAX_WORLD_SIZE:
        raise UsageError(f"lockstep world size must be 1 to {MAX_WORLD_SIZE}, got {size}")
    inputs = case.make_inputs()
    rendezvous = _Rendezvous(size, timeout)
    results: list[RankOutputs | None] = [None] * size
    errors: dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        try:
            results[rank] = run_rank(case, inputs, fn, rank, LockstepGroup(rendezvous, rank), size, device)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, none escapes the thread
            errors[rank] = e
            rendezvous.barrier.abort()  # peers waiting in a collective stop waiting

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True, name=f"rank{r}") for r in range(size)]
    for th in threads:
        th.start()
    # Collectives give up after `timeout`; the grace lets the waiting ranks report where they were.
    deadline = time.monotonic() + timeout + max(1.0, 0.1 * timeout)
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, th in enumerate(threads) if th.is_alive()]
    if hung:
        rendezvous.barrier.abort()  # a hung thread cannot be killed; it is a daemon and is abandoned
        raise ImplError(f"rank {hung[0]}: timed out after {timeout:g} s"
                        + (f" (also ranks {', '.join(map(str, hung[1:]))})" if hung[1:] else ""))
    if errors:
        raise ImplError(_describe_failure(errors, size, timeout))
    return results  # type: ignore[return-value]


def _describe_failure(errors: dict[int, BaseException], size: int, timeout: float) -> str:
    """Name the rank that caused the failure, not the peers that merely stopped waiting for it."""
    causes = {r: e for r, e in errors.items() if not isinstance(e, RankFailed)}
    if not causes:  # the waiting ranks timed out: the others finished without joining that collective
        absent = [r for r in range(size) if r not in errors]
        waiting = sorted(errors)
        first = errors[waiting[0]]
        return (f"rank {', '.join(map(str, absent))}: never joined a collective that ranks "
                f"{', '.join(map(str, waiting))} waited in ({first}; timed out after {timeout:g} s)")
    rank, e = min(causes.items())
    if isinstance(e, ImplError):
        return f"rank {rank}: {e}"
    lines = str(e).strip().splitlines()
    return f"rank {rank}: raised {type(e).__name__}: {lines[0][:200] if lines else ''}"
