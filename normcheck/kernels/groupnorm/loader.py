"""Build (once, cached) and load normcheck's channels-last GroupNorm C++ kernel.

The extension is compiled with ``torch.utils.cpp_extension.load`` (ninja) into
``$NORMCHECK_CACHE`` or ``~/.cache/normcheck/groupnorm/<hash>``, where the hash covers the source,
the flags and the torch version: an edited source or a new torch builds afresh, anything else
reuses the build (a second load in a new process takes well under a second).

    python -m normcheck.kernels.groupnorm      # build now (CI does, before the tests), print where
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import platform
import os
import shutil
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

from ...core.disk_cache import cache_root
from ...core.errors import SetupError

SOURCE = Path(__file__).with_name("group_norm_cl.cpp")
CFLAGS = ["-O3", "-fopenmp", "-march=native", "-ffp-contract=off"]
LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_module = None


class BuildError(SetupError):
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
    """The compiled extension module: the one built into this digest's directory, else built now (once across
    processes: _build_lock)."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        directory = build_dir()
        name = f"normcheck_groupnorm_{directory.name}"  # (the directory is named by the digest: read once)
        built = directory / f"{name}.so"
        if not built.is_file():
            _build(directory, name)
        _module = _imported(name, built)
        return _module


def _build(directory: Path, name: str) -> None:
    if _compiler() is None:
        raise BuildError("normcheck's GroupNorm kernel needs a C++ compiler (c++/g++ on PATH, or $CXX); none was found")
    from torch.utils import cpp_extension

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _build_lock(directory):
            if (directory / f"{name}.so").is_file():
                return  # (another process built it while this one waited)
            print("normcheck: building the GroupNorm kernel (first use, 30-90 s on 2 cores; cached afterwards)...",
                  file=sys.stderr, flush=True)
            cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
                               build_directory=str(directory), verbose=False)
    except OSError as e:  # (a cache that cannot be written: say where, and how to choose another)
        raise BuildError(f"normcheck's GroupNorm kernel is built into {directory}, which cannot be written "
                         f"({e.strerror}): set NORMCHECK_CACHE to a writable directory") from e
    except Exception as e:  # compiler errors: one line, the full log is in the build directory
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BuildError(f"building normcheck's GroupNorm kernel failed in {directory}: {first}") from e


@contextmanager
def _build_lock(directory: Path):
    """One builder at a time across processes, under an OS lock that a killed process gives up. torch's own build
    lock is a file (`lock`), which a builder stopped by Ctrl-C leaves behind and every later build then waits on for
    ever: while this lock is held no other builder is alive, so such a file is stale and goes."""
    with open(directory / "build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _imported(name: str, path: Path):
    """The built extension imported from its file: its directory's digest covers the source, the flags, torch and the
    CPU, so a file there is up to date (nothing is written: a read-only cache holding a build serves it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
