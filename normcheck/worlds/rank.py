"""What one rank does for one case, in any world: take its slice, run forward and backward.

The same function runs in a lockstep thread, a gloo worker process and a torchrun process, so
every world sees the implementation the same way.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..cases import Case, CaseInputs, TorchInputs
from ..kernels import syncbn as _syncbn_primitives  # noqa: F401  registers the CPU SyncBN primitives
from ..runners import ImplError, check_tensor, grad_leaves

RankOutputs = dict[str, "torch.Tensor | None"]


def rank_rows(case: Case, rank: int) -> slice:
    """The batch rows `rank` holds under `case.split`."""
    start = sum(case.split[:rank])
    return slice(start, start + case.split[rank])


def rank_inputs(case: Case, inputs: CaseInputs, rank: int) -> TorchInputs:
    """This rank's slice of x and dy, and its own replicas of γ, β and the running stats."""
    t = inputs.torch_inputs()
    rows = rank_rows(case, rank)
    return TorchInputs(
        x=t.x[rows].detach(), dy=t.dy[rows].detach(), weight=t.weight, bias=t.bias,
        running_mean=t.running_mean, running_var=t.running_var,
    )


def run_rank(case: Case, inputs: CaseInputs, fn: Callable, rank: int, group, world_size: int) -> RankOutputs:
    """Run `fn` (the syncbn contract) on this rank's slice; return its outputs.

    Raises ImplError for interface faults (wrong type, shape, dtype, inputs modified).
    """
    t = rank_inputs(case, inputs, rank)
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
    return out
