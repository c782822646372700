"""SyncBatchNorm followed by SiLU, fused: the output is SiLU(BN(x)); y names that output."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import reference
from . import batchnorm, syncbn
from .core import Op


def reference_outputs(i) -> dict[str, np.ndarray]:
    c = i.case
    z, fwd = reference.silu_bn_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, c.momentum, c.eps)
    bwd = reference.silu_bn_backward(i.dy, i.x, i.weight, i.bias, c.eps)
    return batchnorm.drop_none(y=z, running_mean=fwd.running_mean, running_var=fwd.running_var,
                               dx=bwd.dx, dweight=bwd.dweight, dbias=bwd.dbias)


# SyncBN's factors without the big profile: in eval mode |x| ~ 1e3 reaches SiLU as |y| ~ 1e3, where SiLU'(y) ~ e^-700
# underflows in the kernel's intermediates and the reference's 1e-306 is no finding
SWEEP = replace(syncbn.SWEEP, factors=tuple(f.without("big") if f.name == "profile" else f for f in syncbn.SWEEP.factors))

OP = Op(
    name="syncbn_silu",
    description="SyncBatchNorm followed by SiLU, fused (the output is SiLU(BN(x)); y names that output)",
    signature="fn(input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size)"
    " -> SiLU(SyncBN(input))",
    call=syncbn.call, reference=reference_outputs, view=batchnorm.view, unit="channel",
    outputs=("y", "running_mean", "running_var", "dx", "dweight", "dbias"), required=syncbn.REQUIRED,
    running_stats=True, distributed=True, world="gloo", sweep=SWEEP, eps_zero=batchnorm.EPS_ZERO_MODES, epilogue=reference.SILU,
    double_backward=False, why_once_differentiable=syncbn.WHY_ONCE, eval_keyword=syncbn.EVAL_KEYWORD,
    default_impl="fused-silu",  # torch ships no fused BN + SiLU
)
