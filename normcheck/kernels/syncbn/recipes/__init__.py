"""SyncBN recipes: our own autograd Functions in the styles SyncBN has been written in over the years.

Each has the syncbn contract `fn(input, weight, bias, running_mean, running_var, eps, momentum,
process_group, world_size)`. They call the aten SyncBN primitives (normcheck registers CPU kernels
for them) and normcheck.kernels.syncbn.collectives, so they run in the lockstep and gloo worlds.
"""
from __future__ import annotations

from ....ops import Impl

_HERE = "normcheck.kernels.syncbn.recipes"


def _recipe(name: str, module: str, description: str, worlds: tuple[str, ...] = (), op: str = "syncbn",
            attr: str = "sync_batch_norm", eval_mode: bool = False) -> Impl:
    # No `worlds`: every world, the CUDA ones included (recipes allocate on x's device).
    modes = ("train", "eval") if eval_mode else ("train",)
    return Impl(name, op, description, f"{_HERE}.{module}:{attr}", world="lockstep", worlds=worlds,
                capabilities=f"all dtypes and memory formats, {' and '.join(modes)} mode", modes=modes)


IMPLS = (
    _recipe("torch19", "torch19", "torch >= 1.9 style: one combined all_reduce, sums + int32 counts, empty ranks join",
            eval_mode=True),
    _recipe("torch15", "torch15", "torch 1.5-1.8 style: mean_dy = all-reduced sum / total count"),
    _recipe("pre15", "pre15", "pre-1.5 style: per-rank means averaged over the world size (wrong on uneven splits)"),
    _recipe("horovod", "horovod", "Horovod style: separate gathers, two async all_reduces in backward"),
    _recipe("inplace-abn", "inplace_abn", "InplaceABN style: backward recomputes x from y (error grows as |γ| → 0)"),
    _recipe("master-worker", "master_worker",
            "pytorch-syncbn DataParallel protocol: replica threads, master/worker queues", ("lockstep",)),
    _recipe("fused-silu", "fused_silu", "fused SyncBN + SiLU; backward recomputes BN(x) instead of saving it",
            op="syncbn_silu", attr="sync_batch_norm_silu", eval_mode=True),
)
