"""SyncBatchNorm: BatchNorm statistics over the batch split across the ranks of a world.

The reference is BatchNorm of the whole batch on one device; each rank's dx is compared as its
slice of the whole dx, dweight/dbias as the sum over ranks of each rank's local gradients.
"""
from __future__ import annotations

from dataclasses import replace

from . import batchnorm
from .core import Impl, KnownIssue, Op, Signature
from .design import (DTYPE, LAYOUT, MOMENTUM, PROFILE, Design, Factor, channel_factor, eps_factor, levels,
                     nc_spatial, rank_factor, spatial_size, split_factor)

SIGNATURE = ("fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)"
             " -> Tensor  (torch.nn.modules._functions.SyncBatchNorm.apply); in eval mode also training=False")
REQUIRED = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")


# The batch split over ranks: uneven splits, empty ranks (first, middle, last); spatial sizes whose per-rank
# counts (323·n) bf16 or f16 cannot hold exactly, so counts kept in the wrong dtype show.
SWEEP = Design(
    factors=(
        split_factor(
            (4,), "one rank: the collectives over a world of one",
            (3, 5), "two uneven ranks",
            (2, 0, 6), "an empty rank in the middle",
            (0, 3, 5), "an empty first rank (rank 0 often leads a collective)",
            (1, 2, 3, 2), "four uneven ranks",
            (5, 3, 0, 1), "an empty rank and a rank of one",
        ),
        Factor("spatial", levels(
            35, "5x7: small per-rank sets",
            323, "17x19: per-rank counts 323·n that bf16 cannot hold exactly",
        ), read=spatial_size),
        channel_factor(1, 3, 8, 65),
        rank_factor((3, 4, 5)),
        DTYPE.without(("f16", "f16")),  # (plain f16: torch's empty-rank issue aborts the ranks; bf16 shows it)
        LAYOUT.without(*(v for v in LAYOUT.values if v[0] != v[1] or v[0] == "sliced")),  # x and dy alike
        PROFILE.without("exact", "sparse_dy", "tiny"),  # (fewer: every case runs a world of processes)
        eps_factor(0.0, 1e-10, 1e-5, 1e-2),
        MOMENTUM,
    ),
    shape=lambda v: {"shape": nc_spatial(sum(v["split"]), v["channels"], v["spatial"], v["rank"])},
)


EVAL_KEYWORD = "training"  # the Function has no eval mode: nn.SyncBatchNorm calls F.batch_norm instead


def call(fn, t, case, group, world_size):
    args = (t.x, t.weight, t.bias, t.running_mean, t.running_var, case.eps, case.momentum, group, world_size)
    return fn(*args) if case.training else fn(*args, **{EVAL_KEYWORD: False})


ARRAY_SIGNATURE = ("fn(x, weight, bias, running_mean, running_var, *, training, momentum, eps, channel_axis, mask, "
                   "axis_name) -> (y, running_mean, running_var)  (one device's rows, called on every device of the "
                   "world: mask is None, or a boolean per row (False: padding to the largest share); axis_name: the "
                   "device axis to reduce over, None where the framework's replica context reduces; running "
                   "statistics as for batchnorm)")


def array_call(fn, a, case):
    return fn(a.x, a.weight, a.bias, a.running_mean, a.running_var, training=case.training, momentum=case.momentum,
              eps=case.eps, channel_axis=a.channel_axis, mask=a.mask, axis_name=a.axis_name)


def sync_batch_norm(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size,
                    training=True):
    """What torch.nn.SyncBatchNorm.forward runs: its SyncBatchNorm Function in training; in eval mode
    F.batch_norm with the running statistics, no collective."""
    import torch.nn.functional as F
    from torch.nn.modules._functions import SyncBatchNorm

    if training:
        return SyncBatchNorm.apply(input, weight, bias, running_mean, running_var, eps, momentum, process_group,
                                   world_size)
    return F.batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)


# torch's SyncBatchNorm Function is once differentiable (its backward calls collectives and primitives that
# have no derivatives), and a second derivative across ranks needs a convention for the replicated γ's
# cotangent that normcheck has not fixed yet.
WHY_ONCE = ("a double backward or forward mode across a world is not defined by normcheck yet (torch's "
            "SyncBatchNorm Function is only once differentiable and has no jvp)")

EMPTY_RANK_HALF = KnownIssue(
    "torch-syncbn-empty-rank-half",
    "torch.nn.modules._functions.SyncBatchNorm: an empty rank sends zeros in the INPUT dtype (f16/bf16) while "
    "the others send float32 statistics, so the all_gather sizes differ: gloo aborts the process (SIGABRT, "
    "'Received data size doesn't match expected size'); on NCCL the gather is corrupt or hangs",
    lambda c: c.dtype in ("f16", "bf16") and c.split is not None and 0 in c.split and c.training,
    Signature(message=r"died \(exit code -6, SIGABRT\).*(Received data size doesn't match expected size"
                      r"|op\.preamble\.length <= op\.nbytes)"),
)

BIAS_WITHOUT_WEIGHT = KnownIssue(
    "torch-syncbn-bias-without-weight",
    "torch.nn.modules._functions.SyncBatchNorm.backward returns no gradient for a bias given without a weight "
    "(`if weight is None or not needs_input_grad[2]: grad_bias = None`): the bias silently never trains, "
    "although batch_norm_backward_reduce computed it",
    lambda c: c.has_bias and not c.has_weight and "dbias" in c.grads and c.training,
    Signature(message=r"dbias is None"),
)

# In eval mode nn.SyncBatchNorm is F.batch_norm: torch's BatchNorm issues, there only
EVAL_MODE_ISSUES = tuple(replace(k, applies=lambda c, k=k: not c.training and k.applies(c)) for k in batchnorm.TORCH_ISSUES)

OP = Op(
    name="syncbn",
    description="SyncBatchNorm: BatchNorm statistics over the batch split across ranks (empty ranks allowed)",
    signature=SIGNATURE, call=call, reference=batchnorm.reference_outputs, view=batchnorm.view, unit="channel",
    outputs=batchnorm.OUTPUTS, required=REQUIRED, saved_stats=("mean", "invstd"), running_stats=True,
    distributed=True, world="gloo", sweep=SWEEP, double_backward=False, eps_zero=batchnorm.EPS_ZERO_MODES,
    why_once_differentiable=WHY_ONCE, eval_keyword=EVAL_KEYWORD,
    array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(
        # It calls torch.distributed itself: a real process group, on normcheck's CPU primitives.
        Impl("torch", "syncbn", "torch.nn.SyncBatchNorm's forward as torch ships it (its SyncBatchNorm Function, "
             "on normcheck's CPU primitives; F.batch_norm in eval mode)", "normcheck.ops.syncbn:sync_batch_norm",
             world="gloo",
             worlds=("gloo", "env"), capabilities="all dtypes and memory formats",
             known_issues=(EMPTY_RANK_HALF, BIAS_WITHOUT_WEIGHT, *EVAL_MODE_ISSUES)),
    ),
)
