"""Op records (in the spirit of PyTorch's OpInfo): everything generic code needs to know about an op.

Adding an op is one record here plus one reference module; compare, the CLI and the tests are
generic over these records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import reference
from .cases import CaseInputs
from .errors import UsageError
from .runners import Runner, functional_batchnorm, functional_groupnorm


@dataclass(frozen=True)
class Op:
    name: str
    description: str
    signature: str                     # the public contract for `--impl module:attr`
    required: tuple[str, ...]          # outputs every implementation must produce
    reference: Callable[[CaseInputs], dict[str, np.ndarray]]
    adapt: Callable[[Callable], Runner] | None  # wraps a user function with `signature`


def _batchnorm_reference(i: CaseInputs) -> dict[str, np.ndarray]:
    c = i.case
    fwd = reference.batch_norm_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, c.momentum, c.eps)
    bwd = reference.batch_norm_backward(i.dy, i.x, i.weight, c.eps, has_bias=i.bias is not None)
    return _drop_none(
        y=fwd.y, mean=fwd.mean, invstd=fwd.invstd, running_mean=fwd.running_mean, running_var=fwd.running_var,
        dx=bwd.dx, dweight=bwd.dweight, dbias=bwd.dbias,
    )


def _silu_bn_reference(i: CaseInputs) -> dict[str, np.ndarray]:
    c = i.case
    z, fwd = reference.silu_bn_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, c.momentum, c.eps)
    bwd = reference.silu_bn_backward(i.dy, i.x, i.weight, i.bias, c.eps)
    return _drop_none(y=z, running_mean=fwd.running_mean, running_var=fwd.running_var,
                      dx=bwd.dx, dweight=bwd.dweight, dbias=bwd.dbias)


def _groupnorm_reference(i: CaseInputs) -> dict[str, np.ndarray]:
    c = i.case
    fwd = reference.group_norm_forward(i.x, c.groups, i.weight, i.bias, c.eps)
    bwd = reference.group_norm_backward(i.dy, i.x, c.groups, i.weight, c.eps, has_bias=i.bias is not None)
    return _drop_none(y=fwd.y, mean=fwd.mean, rstd=fwd.rstd, dx=bwd.dx, dweight=bwd.dweight, dbias=bwd.dbias)


def _drop_none(**arrays) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if v is not None}


OPS: dict[str, Op] = {
    "batchnorm": Op(
        name="batchnorm",
        description="BatchNorm, one process, training mode: per-channel statistics over (N, spatial)",
        signature="fn(input, running_mean, running_var, weight, bias, training, momentum, eps) -> Tensor"
        "  (torch.nn.functional.batch_norm)",
        required=("y", "dx", "dweight", "dbias", "running_mean", "running_var"),
        reference=_batchnorm_reference,
        adapt=functional_batchnorm,
    ),
    "syncbn": Op(
        name="syncbn",
        description="SyncBatchNorm: BatchNorm statistics over the batch split across ranks (empty ranks allowed)",
        signature="fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)"
        " -> Tensor  (torch.nn.modules._functions.SyncBatchNorm.apply)",
        required=("y", "dx", "dweight", "dbias", "running_mean", "running_var"),
        reference=_batchnorm_reference,  # the full batch, as if on one device
        adapt=None,  # syncbn implementations also need a world: see normcheck.syncbn
    ),
    "syncbn_silu": Op(
        name="syncbn_silu",
        description="SyncBatchNorm followed by SiLU, fused (the output is SiLU(BN(x)); y names that output)",
        signature="fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)"
        " -> SiLU(SyncBN(input))",
        required=("y", "dx", "dweight", "dbias", "running_mean", "running_var"),
        reference=_silu_bn_reference,
        adapt=None,  # runs in a world, like syncbn
    ),
    "groupnorm": Op(
        name="groupnorm",
        description="GroupNorm: statistics per (sample, group) over (C/G, spatial)",
        signature="fn(input, num_groups, weight, bias, eps) -> Tensor  (torch.nn.functional.group_norm)",
        required=("y", "dx", "dweight", "dbias"),
        reference=_groupnorm_reference,
        adapt=functional_groupnorm,
    ),
}


def get_op(name: str) -> Op:
    if name not in OPS:
        raise UsageError(f"unknown op {name!r}; available: {', '.join(OPS)}")
    return OPS[name]
