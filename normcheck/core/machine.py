"""What this machine has: the memory a case may use."""
from __future__ import annotations

import os


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
