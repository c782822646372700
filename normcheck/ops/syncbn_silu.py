"""SyncBatchNorm followed by SiLU, fused: the output is SiLU(BN(x)); y names that output."""
from __future__ import annotations

from dataclasses import replace

from ..reference.stages import SILU, Activation
from . import syncbn
from .fused import fused

# SyncBN's factors without the big profile: in eval mode |x| ~ 1e3 reaches SiLU as |y| ~ 1e3, where SiLU'(y) ~ e^-700
# underflows in the kernel's intermediates and the reference's 1e-306 is no finding
SWEEP = replace(syncbn.SWEEP, factors=tuple(f.without("big") if f.name == "profile" else f for f in syncbn.SWEEP.factors))

OP = fused(
    syncbn.OP, (Activation(SILU),), name="syncbn_silu",
    description="SyncBatchNorm followed by SiLU, fused (the output is SiLU(BN(x)); y names that output)",
    signature="fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)"
    " -> SiLU(SyncBN(input))",
    outputs=("y", "running_mean", "running_var", "dx", "dweight", "dbias"), saved_stats=(), sweep=SWEEP,
    array_signature=None, array_call=None, impls=(),
    default_impl="fused-silu",  # torch ships no fused BN + SiLU
)
