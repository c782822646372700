"""The failure vocabulary every world shares: what a rank's failure was, and one line naming the
ranks that caused it (not the peers that merely stopped waiting for them).

A failure is (kind, text, collective): kind "impl" (an interface fault, ImplError), "raised" (an
exception), "died" (the process ended), "timed out" or "unsupported" (the rank declined the case: it raised
normcheck.Unsupported; every rank declining is a SKIP, `declined`); `collective` names the collective the rank
was in when it failed, which makes it most likely a consequence of a peer.
"""
from __future__ import annotations

import os
import re
import resource
import signal
import traceback

from ..core.errors import ImplError, Unsupported
from ..core.machine import CASE_MEMORY_VARIABLE, gib
from ..core.text import exception_text, raised_at, rank_list

Failure = tuple[str, str, "str | None"]
UNSUPPORTED = "unsupported"


def _torch_dirs() -> tuple[str, str]:
    import torch

    root = os.path.dirname(torch.__file__) + os.sep
    return root, os.path.join(root, "distributed") + os.sep


def collective_of(frames) -> str | None:
    """The torch.distributed function a stack (outermost first) is inside, if any."""
    _, dist_dir = _torch_dirs()
    for f in frames:
        if f.filename.startswith(dist_dir) and not f.filename.endswith("c10d_logger.py"):
            return f.name
    return None


def failure_of(e: BaseException) -> Failure:
    """(kind, text, collective) for an exception raised on a rank; `collective` names the
    torch.distributed call it came out of (then it is most likely a consequence of a peer)."""
    if isinstance(e, Unsupported):  # (before ImplError: NotDifferentiable is both)
        return UNSUPPORTED, str(e), None
    if isinstance(e, ImplError):
        return "impl", str(e), None
    collective = collective_of(traceback.extract_tb(e.__traceback__))
    if collective is None:
        try:
            import torch.distributed as dist

            if isinstance(e, getattr(dist, "DistError", ())):
                collective = "a collective"
        except ImportError:  # pragma: no cover
            pass
    return "raised", exception_text(e) + raised_at(e), collective


def describe_failures(failures: dict[int, Failure]) -> str:
    """One line naming the ranks that caused a failure (ranks that failed inside a collective are
    only named when nobody else failed) and their causes; identical causes are grouped."""
    primary = {r: f for r, f in failures.items() if f[2] is None} or failures
    by_text: dict[str, list[int]] = {}
    for r in sorted(primary):
        kind, text, collective = primary[r]
        if kind == UNSUPPORTED:  # (not every rank declined: `declined` makes that a SKIP)
            text = f"declined the case (not supported: {text}) that other ranks ran"
        if collective is not None and collective != "a collective":
            text = f"{text} (in {collective})"
        by_text.setdefault(text, []).append(r)
    return "; ".join(f"{rank_list(ranks)}: {text}" for text, ranks in by_text.items())


def declined(failures: dict[int, Failure], size: int) -> str | None:
    """The reason when every one of the `size` ranks declined the case (raised Unsupported): the case is a SKIP
    row; None otherwise."""
    if len(failures) != size or any(kind != UNSUPPORTED for kind, _, _ in failures.values()):
        return None
    return "; ".join(dict.fromkeys(failures[r][1] for r in sorted(failures)))


def exit_text(code: int | None) -> str:
    if code is None:
        return "died (closed its connection)"
    if code < 0:
        try:
            return f"died (exit code {code}, {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"died (exit code {code})"


def timed_out(ranks, timeout: float, where: str = "") -> str:
    """'ranks 1, 2: timed out after 5 s at file.py:12 in fn'."""
    return f"{rank_list(ranks)}: timed out after {timeout:g} s" + (f" at {where}" if where else "")


def never_joined(absent, waiting, what: str, timeout: float | None = None) -> str:
    """The waiting ranks gave up in a collective (`what`, e.g. "all_gather #2 at recipe.py:40") that the
    absent ones never joined: they finished the case (a deadlock), or, with `timeout`, did not come in time."""
    if timeout is None:
        verb = "waits" if len(list(waiting)) == 1 else "wait"
        return f"{rank_list(absent)}: finished the case without joining a collective that {rank_list(waiting)} {verb} in ({what})"
    return (f"{rank_list(absent)}: never joined a collective that {rank_list(waiting)} waited in "
            f"({what}; timed out after {timeout:g} s)")


# ----------------------------------------------------------------------------- memory
# How allocators say a request failed: torch's CPU allocator, CUDA's, and the C library's errno
_OUT_OF_MEMORY = re.compile(r"can't allocate memory|not enough memory|out of memory|Cannot allocate memory", re.I)
_ASKED = re.compile(r"allocate (\d+) bytes|Unable to allocate ([\d.]+ [KMGTP]?i?B)")


def limit_memory(budget: int | None) -> None:
    """Let this process allocate `budget` bytes beyond what it holds now (its data segment: what malloc and anonymous
    mappings take), None: no limit. A request past it fails where it is made (MemoryError, torch's "can't allocate
    memory"), which `memory_failure` reads; the hard limit stays as it was, so the next case may have another."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = resource.RLIM_INFINITY if budget is None else _data_size() + budget
    if hard != resource.RLIM_INFINITY:
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _data_size() -> int:
    """This process's data segment now (VmData), in bytes; 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_failure(e: BaseException, budget: int | None) -> str | None:
    """The SKIP row's reason when `e` is an allocation that failed (the case's memory limit, `budget`, or the
    machine's), else None: memory a case cannot have is no verdict on its numerics."""
    text = str(e)
    if not (isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and _OUT_OF_MEMORY.search(text))):
        return None
    asked = _ASKED.search(text)
    request = "" if asked is None else (f": it asked for {gib(int(asked.group(1)))}" if asked.group(1)
                                        else f": it asked for {asked.group(2)}")
    limit = (f"the case's limit ({gib(budget)} for its worker process; ${CASE_MEMORY_VARIABLE} sets it)" if budget is not None
             else "this machine has available")
    return f"needs more memory than {limit}{request}{raised_at(e)}"
