"""What one rank does for one case, in any world: take its slice, run forward and backward.

The same function runs in a lockstep thread, a gloo worker process and a torchrun process, so
every world sees the implementation the same way.
"""
from __future__ import annotations

from typing import Callable

import torch

from torch._prims_common import is_non_overlapping_and_dense_or_false

from ..cases import Case, CaseInputs, TorchInputs
from ..kernels import syncbn as _syncbn_primitives  # noqa: F401  registers the CPU SyncBN primitives
from ..runners import ImplError, check_tensor, grad_leaves

RankOutputs = dict[str, "torch.Tensor | None"]


def rank_rows(case: Case, rank: int) -> slice:
    """The batch rows `rank` holds under `case.split`."""
    start = sum(case.split[:rank])
    return slice(start, start + case.split[rank])


def rank_inputs(case: Case, inputs: CaseInputs, rank: int, device: torch.device | None = None) -> TorchInputs:
    """This rank's slice of x and dy, and its own replicas of γ, β and the running stats
    (on `device` when given, in the same memory layout)."""
    t = inputs.torch_inputs()
    rows = rank_rows(case, rank)
    move = (lambda v: v) if device is None else (lambda v: None if v is None else to_device(v, device))
    return TorchInputs(
        x=move(t.x[rows].detach()), dy=move(t.dy[rows].detach()), weight=move(t.weight), bias=move(t.bias),
        running_mean=move(t.running_mean), running_var=move(t.running_var),
    )


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of `t` on `device` with t's exact strides, even for a non-dense view (`.to` would
    make that one contiguous, and the strided case would not be what it says)."""
    if is_non_overlapping_and_dense_or_false(t):
        return t.to(device)  # keeps the strides of dense tensors
    storage = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())  # the whole buffer t views
    return storage.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def run_rank(case: Case, inputs: CaseInputs, fn: Callable, rank: int, group, world_size: int,
             device: torch.device | None = None) -> RankOutputs:
    """Run `fn` (the syncbn contract) on this rank's slice; return its outputs (on the CPU).

    `device`: where the rank's tensors live (default: the CPU). Raises ImplError for interface
    faults (wrong type, shape, dtype, inputs modified).
    """
    t = rank_inputs(case, inputs, rank, device)
    before = t.snapshot()
    leaves = grad_leaves(t)
    y = fn(t.x, t.weight, t.bias, t.running_mean, t.running_var, case.eps, case.momentum, group, world_size)
    y = check_tensor("y", y, t.x.shape, t.x.dtype)
    if not y.requires_grad:
        raise ImplError("y does not require grad: the implementation detached its output")
    # Every rank runs backward, empty ones included: they must still join the collectives.
    grads = torch.autograd.grad(y, list(leaves.values()), grad_outputs=t.dy, allow_unused=True)
    out: RankOutputs = {"y": y.detach()}
    for name, grad in zip(leaves, grads):
        out[name] = grad
    if out["dx"] is None:
        out["dx"] = torch.zeros_like(t.x)  # autograd's None means zeros
    modified = t.modified_since(before)
    if modified:
        raise ImplError(f"modified its input {', '.join(modified)} in place")
    out["running_mean"], out["running_var"] = t.running_mean, t.running_var
    if device is not None:
        out = {k: None if v is None else v.cpu() for k, v in out.items()}
    return out
