"""The CUDA lockstep worlds: every rank's tensors on one CUDA device, with the aten SyncBN ops
dispatching to torch's CUDA primitives ("torch") or to normcheck's ("normcheck")."""
from __future__ import annotations

import contextlib

import torch

from ..kernels.syncbn.cuda.primitives import using
from .lockstep import lockstep_ranks


def cuda_missing(backend: str) -> str | None:
    """Why `backend` cannot run here (no CUDA device), or None."""
    if torch.cuda.is_available():
        return None
    return (f"no CUDA device: the {backend} backend needs a visible CUDA GPU and a CUDA build of torch "
            f"(torch {torch.__version__}; torch.cuda.is_available() is False)")


def cuda_primitives(provider: str):
    """A context factory yielding the current CUDA device with `provider`'s primitives registered."""

    @contextlib.contextmanager
    def device():
        with using(provider):
            yield torch.device("cuda", torch.cuda.current_device())

    return device


# The CUDA lockstep worlds' ranks (worlds.WORLDS names them)
torch_ranks = lockstep_ranks(cuda_primitives("torch"))
normcheck_ranks = lockstep_ranks(cuda_primitives("normcheck"))
