"""Build (once, cached) and load normcheck's SyncBN CUDA kernels as a ctypes library.

The kernels are plain CUDA C++ (``syncbn_kernels.cu``, no torch headers), compiled by ``nvcc``
into a shared library under ``$NORMCHECK_CACHE`` or ``~/.cache/normcheck`` -- the root the
GroupNorm kernel's cache uses -- in ``syncbn_cuda/<hash>/``, where the hash covers the source, the
flags and the nvcc version: an edited source or another nvcc builds afresh, anything else reuses
the build.  ``$NORMCHECK_CUDA_LIB`` names a prebuilt library to load instead (a machine with a
GPU but no nvcc).  Building needs no GPU; running the kernels does.

    python -m normcheck.kernels.syncbn.cuda.loader      # build now, print the path and the time
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ....core.disk_cache import cache_root
from ....core.errors import SetupError

SOURCE = Path(__file__).with_name("syncbn_kernels.cu")
LIBRARY_NAME = "libnormcheck_syncbn.so"
ABI_VERSION = 2
# SASS for sm_90 (H100/H200) and PTX for compute_80, which the driver JIT-compiles for any newer
# GPU: two targets keep the build at a few seconds.  No fast-math: the kernels are under test.
ARCH_FLAGS = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_80,code=compute_80"]
NVCC_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", *ARCH_FLAGS]

# Every launcher the library exports, with its ctypes signature (restype, argtypes).
_I64, _I32, _F64, _P = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_void_p
SIGNATURES: dict[str, tuple[object, list]] = {
    "nc_abi_version": (_I32, []),
    "nc_error_string": (ctypes.c_char_p, [_I32]),
    "nc_reduce_workspace_bytes": (_I64, [_I32, _I32, _I64, _I64, _I64, _I32]),
    "nc_reduce_plan": (None, [_I64, _I64, _I64, _I32, ctypes.POINTER(_I64)]),
    "nc_check_reduce_coverage": (_I32, [_I64, _I64, _I64, _I32]),
    "nc_check_flat_coverage": (_I32, [_I64, _I64, _I64, _I32]),
    # Every launcher ends with (device index, cudaStream_t).
    # dtype, x, n, c, s, eps, mean, invstd, workspace, workspace_bytes, sm_count
    "nc_batch_norm_stats": (_I32, [_I32, _P, _I64, _I64, _I64, _F64, _P, _P, _P, _I64, _I32, _I32, _P]),
    # stat_dtype, mean, invstd, counts_dtype, counts, world, c, running_dtype, running_mean,
    # running_var, momentum, eps, out_dtype, mean_out, invstd_out
    "nc_batch_norm_gather_stats_with_counts": (
        _I32, [_I32, _P, _P, _I32, _P, _I64, _I64, _I32, _P, _P, _F64, _F64, _I32, _P, _P, _I32, _P]),
    # dtype, param_dtype, x, y, n, c, s, weight, bias, mean, invstd, sm_count
    "nc_batch_norm_elemt": (_I32, [_I32, _I32, _P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _I32, _I32, _P]),
    # dtype, param_dtype, dy, x, n, c, s, mean, invstd, sum_dy, sum_dy_xmu, grad_weight, grad_bias,
    # workspace, workspace_bytes, sm_count
    "nc_batch_norm_backward_reduce": (
        _I32, [_I32, _I32, _P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _I32, _I32, _P]),
    # dtype, param_dtype, dy, x, dx, n, c, s, mean, invstd, weight, sum_dy, sum_dy_xmu, count,
    # world, sm_count
    "nc_batch_norm_backward_elemt": (
        _I32, [_I32, _I32, _P, _P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _P, _P, _I64, _I32, _I32, _P]),
}
LAUNCHERS = tuple(n for n in SIGNATURES if n.startswith("nc_batch_norm_"))

_lock = threading.Lock()
_library: ctypes.CDLL | None = None


class BuildError(SetupError):
    """The CUDA library could not be built or loaded (no nvcc, a compile error, a bad library)."""


# Where the CUDA toolkit installs nvcc when it is not on PATH.
FALLBACK_NVCC = ("/usr/local/cuda/bin/nvcc",)


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME/bin, else PATH, else FALLBACK_NVCC; None when there is none."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home) / "bin" / "nvcc"] if home else []
    found = shutil.which("nvcc")
    candidates += [Path(found)] if found else []
    candidates += [Path(p) for p in FALLBACK_NVCC]
    return next((str(p) for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)


def nvcc_version(nvcc: str) -> str:
    """The last line of `nvcc --version` (e.g. "Build cuda_13.0.r13.0/compiler.36424714_0")."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    return out.splitlines()[-1] if out else "unknown"


def release(version_text: str) -> str | None:
    """"13.0" from nvcc's version text, if it says."""
    m = re.search(r"cuda_(\d+\.\d+)", version_text) or re.search(r"release (\d+\.\d+)", version_text)
    return m.group(1) if m else None


def library_path(nvcc: str | None = None) -> Path | None:
    """Where the library for this source, these flags and this nvcc lives (built or not).

    $NORMCHECK_CUDA_LIB wins; without it and without nvcc there is no path (None)."""
    prebuilt = os.environ.get("NORMCHECK_CUDA_LIB")
    if prebuilt:
        return Path(prebuilt)
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return None
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(repr((NVCC_FLAGS, nvcc_version(nvcc), ABI_VERSION)).encode())
    return cache_root() / "syncbn_cuda" / h.hexdigest()[:12] / LIBRARY_NAME


def is_built() -> bool:
    path = library_path()
    return path is not None and path.is_file()


def _missing_nvcc() -> BuildError:
    return BuildError("nvcc not found: normcheck's CUDA SyncBN kernels need the CUDA toolkit's nvcc "
                      "(on PATH, or $CUDA_HOME/bin), or $NORMCHECK_CUDA_LIB naming a prebuilt library")


def build(force: bool = False, verbose: bool = False) -> Path:
    """Compile the library unless the cache already holds it; returns its path.

    The compiler writes into a temporary file in the cache directory that is renamed into place,
    so a concurrent build or an interrupted one never leaves a half-written library behind."""
    if os.environ.get("NORMCHECK_CUDA_LIB"):
        return library_path()  # type: ignore[return-value]
    nvcc = find_nvcc()
    if nvcc is None:
        raise _missing_nvcc()
    path = library_path(nvcc)
    assert path is not None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [nvcc, *NVCC_FLAGS, "-o", tmp, str(SOURCE)]
    if verbose:
        print(" ".join(cmd), file=sys.stderr, flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            log = path.parent / "build.log"
            log.write_text(done.stdout + done.stderr)
            first = next((line for line in (done.stderr + done.stdout).splitlines() if "error" in line),
                         f"nvcc exited with {done.returncode}")
            raise BuildError(f"building normcheck's CUDA SyncBN kernels failed (log: {log}): {first.strip()}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set restype/argtypes of every exported function; a missing one is a BuildError."""
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise BuildError(f"{lib._name} does not export {name}: rebuild it (python -m "
                             f"normcheck.kernels.syncbn.cuda.loader)") from None
        fn.restype, fn.argtypes = restype, argtypes
    if lib.nc_abi_version() != ABI_VERSION:
        raise BuildError(f"{lib._name} has interface version {lib.nc_abi_version()}, expected {ABI_VERSION}: rebuild it")
    return lib


def load() -> ctypes.CDLL:
    """The library, built on first use and loaded once per process (no GPU needed to load it)."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            path = build()
            if not path.is_file():
                raise BuildError(f"no CUDA SyncBN library at {path} ($NORMCHECK_CUDA_LIB)")
            try:
                _library = declare(ctypes.CDLL(str(path)))
            except OSError as e:
                raise BuildError(f"cannot load {path}: {e}") from None
    return _library


def main() -> int:
    start = time.perf_counter()
    try:
        path = build(verbose=True)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    declare(ctypes.CDLL(str(path)))
    print(f"{path} ({path.stat().st_size / 1e6:.2f} MB, {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
