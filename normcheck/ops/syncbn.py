"""SyncBatchNorm: BatchNorm statistics over the batch split across the ranks of a world.

The reference is BatchNorm of the whole batch on one device; each rank's dx is compared as its
slice of the whole dx, dweight/dbias as the sum over ranks of each rank's local gradients.
"""
from __future__ import annotations

from . import batchnorm
from .core import Impl, KnownIssue, Op, Signature, SplitSweep

SIGNATURE = ("fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)"
             " -> Tensor  (torch.nn.modules._functions.SyncBatchNorm.apply)")
REQUIRED = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")


def call(fn, t, case, group, world_size):
    return fn(t.x, t.weight, t.bias, t.running_mean, t.running_var, case.eps, case.momentum, group, world_size)


EMPTY_RANK_HALF = KnownIssue(
    "torch-syncbn-empty-rank-half",
    "torch.nn.modules._functions.SyncBatchNorm: an empty rank sends zeros in the INPUT dtype (f16/bf16) while "
    "the others send float32 statistics, so the all_gather sizes differ: gloo aborts the process (SIGABRT, "
    "'Received data size doesn't match expected size'); on NCCL the gather is corrupt or hangs",
    lambda c: c.dtype in ("f16", "bf16") and c.split is not None and 0 in c.split,
    Signature(message=r"died \(exit code -6, SIGABRT\).*(Received data size doesn't match expected size"
                      r"|op\.preamble\.length <= op\.nbytes)"),
)

OP = Op(
    name="syncbn",
    description="SyncBatchNorm: BatchNorm statistics over the batch split across ranks (empty ranks allowed)",
    signature=SIGNATURE, call=call, reference=batchnorm.reference_outputs, view=batchnorm.view, unit="channel",
    outputs=batchnorm.OUTPUTS, required=REQUIRED, saved_stats=("mean", "invstd"), running_stats=True,
    distributed=True, world="gloo", sweep=SplitSweep(),
    impls=(
        # It calls torch.distributed itself: a real process group, on normcheck's CPU primitives.
        Impl("torch", "syncbn", "torch.nn.modules._functions.SyncBatchNorm as torch ships it, on normcheck's "
             "CPU primitives", "torch.nn.modules._functions:SyncBatchNorm.apply", world="gloo",
             worlds=("gloo", "env"), capabilities="all dtypes and memory formats",
             known_issues=(EMPTY_RANK_HALF,)),
    ),
)
