"""Calling conventions: turn an implementation into `run(case, inputs) -> outputs`.

Outputs are a dict of torch tensors named like the reference's (y, dx, dweight, dbias, mean,
invstd/rstd, running_mean, running_var). Anything an implementation does wrong at the interface
(returns a non-tensor, a wrong shape or dtype, a detached output) raises ImplError, which the
compare engine turns into a failing row.
"""
from __future__ import annotations

from math import prod
from typing import Callable

import torch

from .cases import Case, TorchInputs
from .dtypes import dtype_name

Outputs = dict[str, "torch.Tensor | None"]
Runner = Callable[[Case, TorchInputs], Outputs]


class ImplError(Exception):
    """The implementation under test misbehaved; the message says how."""


def check_tensor(name: str, value, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ImplError(f"{name} is {type(value).__name__}, expected a tensor")
    if tuple(value.shape) != tuple(shape):
        raise ImplError(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if value.dtype != dtype:
        raise ImplError(f"{name} has dtype {dtype_name(value.dtype)}, expected {dtype_name(dtype)}")
    return value


def grad_leaves(t: TorchInputs) -> dict[str, torch.Tensor]:
    """x, γ and β made to require grad, keyed by the name of their gradient."""
    named = {"dx": t.x, "dweight": t.weight, "dbias": t.bias}
    return {k: v.requires_grad_() for k, v in named.items() if v is not None}


def _backward(y, t: TorchInputs, leaves: dict[str, torch.Tensor]) -> Outputs:
    y = check_tensor("y", y, t.x.shape, t.x.dtype)
    if not y.requires_grad:
        raise ImplError("y does not require grad: the implementation detached its output")
    grads = torch.autograd.grad(y, list(leaves.values()), grad_outputs=t.dy, allow_unused=True)
    out: Outputs = {"y": y.detach()}
    for name, grad in zip(leaves, grads):
        if grad is None:
            raise ImplError(f"{name} is None: no gradient reaches that input")
        out[name] = grad
    return out


def functional_batchnorm(fn: Callable) -> Runner:
    """`fn` has the signature of torch.nn.functional.batch_norm."""

    def run(case: Case, t: TorchInputs) -> Outputs:
        leaves = grad_leaves(t)
        y = fn(t.x, t.running_mean, t.running_var, t.weight, t.bias, True, case.momentum, case.eps)
        out = _backward(y, t, leaves)
        out["running_mean"], out["running_var"] = t.running_mean, t.running_var
        return out

    return run


def functional_groupnorm(fn: Callable) -> Runner:
    """`fn` has the signature of torch.nn.functional.group_norm."""

    def run(case: Case, t: TorchInputs) -> Outputs:
        leaves = grad_leaves(t)
        return _backward(fn(t.x, case.groups, t.weight, t.bias, case.eps), t, leaves)

    return run


def _mask(t: TorchInputs) -> list[bool]:
    return [True, t.weight is not None, t.bias is not None]


def native_batchnorm_backward(case: Case, t: TorchInputs) -> Outputs:
    """aten.native_batch_norm, then aten.native_batch_norm_backward called directly (no autograd)."""
    aten = torch.ops.aten
    y, mean, invstd = aten.native_batch_norm(
        t.x, t.weight, t.bias, t.running_mean, t.running_var, True, case.momentum, case.eps
    )
    dx, dw, db = aten.native_batch_norm_backward(
        t.dy, t.x, t.weight, t.running_mean, t.running_var, mean, invstd, True, case.eps, _mask(t)
    )
    return {"y": y, "mean": mean, "invstd": invstd, "dx": dx, "dweight": dw, "dbias": db,
            "running_mean": t.running_mean, "running_var": t.running_var}


def native_groupnorm_backward(case: Case, t: TorchInputs) -> Outputs:
    """aten.native_group_norm, then aten.native_group_norm_backward called directly (no autograd)."""
    aten = torch.ops.aten
    n, c = case.shape[0], case.shape[1]
    hxw = prod(case.shape[2:])
    y, mean, rstd = aten.native_group_norm(t.x, t.weight, t.bias, n, c, hxw, case.groups, case.eps)
    dx, dw, db = aten.native_group_norm_backward(t.dy, t.x, mean, rstd, t.weight, n, c, hxw, case.groups, _mask(t))
    return {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dweight": dw, "dbias": db}

