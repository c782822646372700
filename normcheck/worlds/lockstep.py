"""The lockstep world: every rank is a thread of this process; collectives meet at a barrier.

For recipes written against normcheck.kernels.syncbn.collectives (they take a LockstepGroup where
torch.distributed would take a ProcessGroup). Any world size from 1 to 64, empty ranks included.
A rank that raises, or never arrives at a collective within the timeout, fails the case with a
message naming it; the barrier is then broken so the other ranks stop waiting. A rank that finishes
while others wait in a collective it never joined ends the case at once (a deadlock).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable

import torch

from ..cases import Case, CaseInputs
from ..core.errors import CaseTimeout, ImplError, Unsupported
from ..frameworks.torch import run_rank
from ..kernels.syncbn import cpu_primitives
from .core import DEFAULT_TIMEOUT, CaseLimit, RankOutputs
from .failures import declined, describe_failures, failure_of, never_joined, timed_out



class RankFailed(Exception):
    """Raised inside a rank that stopped waiting in a collective: a peer failed, finished the case
    without joining it (`deserted`), or the collective timed out."""

    def __init__(self, what: str, deserted: bool = False):
        super().__init__(f"gave up in {what}")
        self.what = what
        self.deserted = deserted


class _Rendezvous:
    """Shared by the ranks of one case: a reusable barrier, one slot per rank, and a shared dict.

    The barrier counts generations, so a rank released from one meeting always leaves it, whatever
    happens next; it breaks when a rank fails (`abort`), when a meeting outlasts the timeout, and as
    soon as a rank has finished the case while others wait for it (`leave`: nothing can complete that
    meeting, so a deadlock ends in moments, not at the timeout)."""

    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.slots: list[torch.Tensor | None] = [None] * size
        self.calls = [0] * size
        self.shared: dict = {}  # for recipes that exchange more than tensors (queues)
        self._cond = threading.Condition()
        self._arrived = 0
        self._generation = 0
        self._broken = False
        self._left: set[int] = set()  # ranks that finished the case (returned or raised)

    def exchange(self, rank: int, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        self.calls[rank] += 1
        self.slots[rank] = tensor.detach().clone()
        self._wait(rank, what)
        everyone = list(self.slots)
        self._wait(rank, what)  # nobody overwrites a slot before every rank has read them all
        return everyone

    def leave(self, rank: int) -> None:
        with self._cond:
            self._left.add(rank)
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._broken = True
            self._cond.notify_all()

    def _wait(self, rank: int, what: str) -> None:
        where = f"{what} #{self.calls[rank]}"
        with self._cond:
            if self._broken:
                raise RankFailed(where, deserted=bool(self._left))
            generation = self._generation
            self._arrived += 1
            if self._arrived == self.size:  # the last to arrive releases everyone
                self._arrived, self._generation = 0, generation + 1
                self._cond.notify_all()
                return
            deadline = time.monotonic() + self.timeout
            while self._generation == generation:
                deserted = bool(self._left)
                left = deadline - time.monotonic()
                if self._broken or deserted or left <= 0:
                    self._broken = True
                    self._cond.notify_all()
                    raise RankFailed(where, deserted=deserted)
                self._cond.wait(left)


class _Exited(ImplError):
    """os._exit called on a rank: in this world a rank is a thread of normcheck's own process, which must go on."""

    def __init__(self, status):
        super().__init__(f"called os._exit({status}): the implementation exits the process (its ranks are threads "
                         "of normcheck's in the lockstep world; the gloo world runs each in a process of its own)")


_REAL_EXIT = os._exit
_RANK_THREADS: set[int] = set()  # the running lockstep ranks' thread idents, whose os._exit is a failure of theirs
_EXIT_LOCK = threading.Lock()
_RUNS = 0  # the lockstep runs under way (their ranks may not have started yet)


def _exit(status):
    if threading.get_ident() in _RANK_THREADS:
        raise _Exited(status)
    _REAL_EXIT(status)


@contextlib.contextmanager
def _ranks_cannot_exit():
    """os._exit on a rank thread raises there instead of ending normcheck silently (exit 4, no summary): the rank
    fails and the row says why. Any other thread's call exits as always. os._exit is the real one again once no run is
    under way and no rank runs, a hung rank that its run abandoned included (it may still call it: _rank_left)."""
    global _RUNS
    with _EXIT_LOCK:
        _RUNS += 1
        os._exit = _exit
    try:
        yield
    finally:
        with _EXIT_LOCK:
            _RUNS -= 1
            _restore_exit()


def _rank_left() -> None:
    with _EXIT_LOCK:
        _RANK_THREADS.discard(threading.get_ident())
        _restore_exit()


def _restore_exit() -> None:
    if not _RUNS and not _RANK_THREADS:  # (under _EXIT_LOCK)
        os._exit = _REAL_EXIT


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


def run_lockstep(case: Case, fn: Callable, timeout: float = DEFAULT_TIMEOUT,
                 device: torch.device | None = None, inputs: CaseInputs | None = None) -> list[RankOutputs]:
    """Run `fn` on every rank of `case.split` as threads; per-rank float64 outputs in rank order.

    `device`: where the ranks' tensors live (default: the CPU; e.g. one CUDA device for all ranks).
    The CPU SyncBN primitives are registered first (the recipes call them)."""
    size = len(case.split)
    cpu_primitives.register()
    inputs = inputs if inputs is not None else case.make_inputs()
    rendezvous = _Rendezvous(size, timeout)
    results: list[RankOutputs | None] = [None] * size
    errors: dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        _RANK_THREADS.add(threading.get_ident())
        try:
            results[rank] = run_rank(case.record, fn, case, inputs, rank, LockstepGroup(rendezvous, rank), size,
                                     device)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, none escapes the thread
            errors[rank] = e
        finally:
            _rank_left()
            if rank in errors:
                rendezvous.abort()  # peers waiting in a collective stop waiting
            rendezvous.leave(rank)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True, name=f"rank{r}") for r in range(size)]
    # Collectives give up after `timeout`; the grace lets the waiting ranks report where they were.
    deadline = time.monotonic() + timeout + max(1.0, 0.1 * timeout)
    with _ranks_cannot_exit():
        for th in threads:
            th.start()
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, th in enumerate(threads) if th.is_alive()]
    if hung:
        rendezvous.abort()  # a hung thread cannot be killed; it is a daemon and is abandoned
        raise CaseTimeout(timed_out(hung, timeout))
    if errors:
        reason = declined({r: failure_of(e) for r, e in errors.items()}, size)
        if reason is not None:
            raise Unsupported(reason)
        timed = all(isinstance(e, RankFailed) and not e.deserted for e in errors.values())
        raise (CaseTimeout if timed else ImplError)(_describe(errors, size, timeout))
    return results  # type: ignore[return-value]


def _describe(errors: dict[int, BaseException], size: int, timeout: float) -> str:
    """Name the ranks that caused the failure, not the peers that merely stopped waiting for them."""
    failures = {r: ("raised", str(e), e.what) if isinstance(e, RankFailed) else failure_of(e)
                for r, e in errors.items()}
    if all(isinstance(e, RankFailed) for e in errors.values()):
        # the waiting ranks gave up: the others finished without joining that collective
        waiting = sorted(errors)
        absent = [r for r in range(size) if r not in errors]
        first = errors[waiting[0]]
        return never_joined(absent, waiting, first.what, None if first.deserted else timeout)
    return describe_failures(failures)


def lockstep_ranks(device_of: Callable | None = None) -> Callable:
    """A World's run_ranks for the lockstep world (on the CPU, or on the device `device_of()` yields
    with its primitives in place)."""

    def run_ranks(bound, case: Case, inputs: CaseInputs, limit: CaseLimit) -> list[RankOutputs]:
        fn = bound.impl.callable()
        if device_of is None:
            return limit.run(case, lambda timeout: run_lockstep(case, fn, timeout, inputs=inputs))
        with device_of() as device:
            return limit.run(case, lambda timeout: run_lockstep(case, fn, timeout, device, inputs))

    return run_ranks


cpu_ranks = lockstep_ranks()  # the lockstep world's (worlds.WORLDS names it)
