"""`normcheck doctor`: what this machine can run -- torch, CUDA, nvcc, normcheck's kernels, JAX and TensorFlow.

`collect_facts()` only looks (no build, no kernel launch); `run_doctor(args, out)` prints them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from .frameworks import FRAMEWORKS
from .kernels.groupnorm import loader as groupnorm
from .kernels.syncbn.cuda import loader as cuda

BUILD_CUDA = "python -m normcheck.kernels.syncbn.cuda.loader"


@dataclass(frozen=True)
class Facts:
    torch_version: str
    cuda_visible: bool
    cuda_devices: tuple[str, ...]        # names of the visible GPUs
    torch_cuda_version: str | None       # the CUDA torch was built with (None: a CPU build)
    nvcc_path: str | None
    nvcc_version: str | None             # e.g. "13.0"
    cuda_library: Path | None            # where the SyncBN CUDA library is (or would be) cached
    cuda_library_built: bool
    groupnorm_dir: Path
    groupnorm_built: bool
    frameworks: tuple[tuple[str, str], ...] = ()  # (framework, its packages' versions, or why it cannot run here)


def collect_facts() -> Facts:
    visible = torch.cuda.is_available()
    devices = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) if visible else ()
    nvcc = cuda.find_nvcc()
    version = cuda.release(cuda.nvcc_version(nvcc)) if nvcc else None
    library = cuda.library_path(nvcc)
    gn_dir = groupnorm.build_dir()
    return Facts(
        torch_version=torch.__version__,
        cuda_visible=visible,
        cuda_devices=devices,
        torch_cuda_version=torch.version.cuda,
        nvcc_path=nvcc,
        nvcc_version=version,
        cuda_library=library,
        cuda_library_built=library is not None and library.is_file(),
        groupnorm_dir=gn_dir,
        groupnorm_built=any(gn_dir.glob(f"normcheck_groupnorm_{gn_dir.name}*.so")),
        frameworks=tuple((FRAMEWORKS.title(name), FRAMEWORKS.missing(name) or ", ".join(
            f"{package} {v}" for package, v in FRAMEWORKS.versions(name).items())) for name in ("jax", "tf")),
    )


def report_lines(f: Facts) -> list[str]:
    build = f" (built with CUDA {f.torch_cuda_version})" if f.torch_cuda_version else " (CPU build)"
    lines = [f"torch: {f.torch_version}{build}"]
    if f.cuda_visible:
        lines.append(f"CUDA visible: yes ({', '.join(f.cuda_devices)})")
    else:
        lines.append("CUDA visible: no (torch.cuda.is_available() is False; the CUDA kernels build but cannot run)")
    if f.nvcc_path:
        lines.append(f"nvcc: {f.nvcc_path} (CUDA {f.nvcc_version or 'version unknown'})")
    else:
        lines.append("nvcc: not found (install the CUDA toolkit, or put nvcc on PATH / set $CUDA_HOME)")
    if f.cuda_library_built:
        lines.append(f"CUDA library: built ({f.cuda_library})")
    elif f.nvcc_path or f.cuda_library:
        lines.append(f"CUDA library: not built (build it with: {BUILD_CUDA})")
    else:
        lines.append("CUDA library: not built (needs nvcc, or $NORMCHECK_CUDA_LIB naming a prebuilt library)")
    if f.groupnorm_built:
        lines.append(f"GroupNorm kernel: built ({f.groupnorm_dir})")
    else:
        lines.append("GroupNorm kernel: not built (it builds on first use of a cl-* GroupNorm implementation, ~30 s)")
    lines += [f"{title}: {text}" for title, text in f.frameworks]
    return lines


def run_doctor(args, out: TextIO) -> int:
    """Print the facts, one per line; always 0 (it reports, it does not judge)."""
    for line in report_lines(collect_facts()):
        print(line, file=out)
    return 0
