"""The CUDA lockstep worlds: every rank's tensors on one CUDA device, with the aten SyncBN ops
dispatching to torch's CUDA primitives ("torch") or to normcheck's ("normcheck")."""
from __future__ import annotations

import contextlib

import torch

from ....errors import UsageError


def require_cuda(backend: str) -> None:
    """One-line UsageError unless torch sees a CUDA device."""
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}"
        raise UsageError(f"no CUDA device: the {backend} backend needs a visible CUDA GPU and a CUDA build of "
                         f"torch ({build}; torch.cuda.is_available() is False)")


@contextlib.contextmanager
def cuda_primitives(provider: str):
    """Yield the current CUDA device, with `provider`'s primitives registered for the block."""
    if not torch.cuda.is_available():
        require_cuda(f"lockstep-cuda ({provider} primitives)")
    from .primitives import using

    with using(provider):
        yield torch.device("cuda", torch.cuda.current_device())
