"""What this machine has: the memory a case may use."""
from __future__ import annotations

import os

from .errors import UsageError


def available_memory() -> int | None:
    """Bytes of memory available now (Linux: MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    g = n / 2**30
    return f"{g:,.0f} GiB" if g >= 100 else f"{g:.3g} GiB"


# What one case's worker process may allocate beyond what it holds when the case starts: a share of the memory
# available then, split over the pool's workers, so that every worker at its limit still leaves the machine half
# (the parent's inputs and references, other programs). A case that asks for more fails to allocate (a 4-D-only layer
# given 2-D input broadcast (C,1,1) against (N,C) and asked for 89.6 GB), a row that says so, instead of waking the
# system's out-of-memory killer. $NORMCHECK_CASE_MEMORY sets it instead (bytes, or with a K/M/G/T suffix).
CASE_MEMORY_SHARE = 0.5
CASE_MEMORY_VARIABLE = "NORMCHECK_CASE_MEMORY"
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def case_memory(workers: int = 1) -> int | None:
    """Bytes one of `workers` worker processes may allocate for a case (None: no limit known)."""
    given = os.environ.get(CASE_MEMORY_VARIABLE, "").strip()
    if given:
        return parse_bytes(given, CASE_MEMORY_VARIABLE)
    have = available_memory()
    return None if have is None else int(have * CASE_MEMORY_SHARE / max(workers, 1))


def parse_bytes(text: str, what: str) -> int:
    """'512M', '2GiB', '1.5G', '1000000' -> bytes; a one-line UsageError otherwise."""
    number = text.upper().removesuffix("B").removesuffix("I")
    suffix = number[-1:] if number[-1:] in _SUFFIXES else ""
    try:
        value = float(number[: len(number) - len(suffix)]) * _SUFFIXES[suffix]
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{what}={text!r} is not an amount of memory: give bytes, or a number with K, M, G or T")
    return int(value)
