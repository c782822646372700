"""Build (once, cached) and load normcheck's channels-last GroupNorm C++ kernel.

The extension is compiled with ``torch.utils.cpp_extension.load`` (ninja) into
``$NORMCHECK_CACHE`` or ``~/.cache/normcheck/groupnorm/<hash>``, where the hash covers the source,
the flags and the torch version: an edited source or a new torch builds afresh, anything else
reuses the build (a second load in a new process takes well under a second).

    python -m normcheck.kernels.groupnorm      # build now (CI does, before the tests), print where
"""
from __future__ import annotations

import hashlib
import platform
import os
import shutil
import sys
import threading
from pathlib import Path

import torch

from ...core.disk_cache import cache_root

SOURCE = Path(__file__).with_name("group_norm_cl.cpp")
CFLAGS = ["-O3", "-fopenmp", "-march=native", "-ffp-contract=off"]
LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_module = None


class BuildError(RuntimeError):
    """The kernel could not be built (no compiler, or the compile failed)."""


def _cpu_flags() -> str:
    """-march=native ties a build to this CPU: a cache shared with another CPU must not be reused."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def _digest() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(repr((CFLAGS, LDFLAGS, torch.__version__, sys.version_info[:2], _cpu_flags())).encode())
    return h.hexdigest()[:12]


def build_dir() -> Path:
    return cache_root() / "groupnorm" / _digest()


def _compiler() -> str | None:
    cxx = os.environ.get("CXX", "c++")
    return shutil.which(cxx) or shutil.which("g++")


def load():
    """The compiled extension module (built on first use)."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _compiler() is None:
            raise BuildError("normcheck's GroupNorm kernel needs a C++ compiler (c++/g++ on PATH, or $CXX); none was found")
        from torch.utils import cpp_extension

        directory = build_dir()
        directory.mkdir(parents=True, exist_ok=True)
        name = f"normcheck_groupnorm_{_digest()}"
        built = any(directory.glob(f"{name}*.so"))
        if not built:
            print("normcheck: building the GroupNorm kernel (first use, about 40 s on 2 cores; cached afterwards)...", file=sys.stderr, flush=True)
        try:
            _module = cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS,
                                         extra_ldflags=LDFLAGS, build_directory=str(directory), verbose=False)
        except Exception as e:  # compiler errors: one line, the full log is in the build directory
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BuildError(f"building normcheck's GroupNorm kernel failed in {directory}: {first}") from e
        return _module
