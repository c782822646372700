"""InstanceNorm in training mode: statistics per (sample, channel) over the spatial dims; running
statistics averaged over the batch."""
from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from .. import reference
from ..core.errors import UsageError
from ..numerics.sets import SetView
from .batchnorm import drop_none
from .core import GridSweep, Impl, Op

SIGNATURE = ("fn(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps) -> Tensor"
             "  (torch.nn.functional.instance_norm)")
OUTPUTS = ("y", "running_mean", "running_var", "dx", "dweight", "dbias")
REQUIRED = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")

# Sets are one instance's spatial values: 7 (and 6: instance-unbiased variance is 1/(S − 1) off),
# past 8192 (8193, 91x91, 5x41x41) and past 65536 (65537, 256x257, 16x64x65). No 2-D input: an
# instance needs spatial dims. Batches of 1 to 4: the running statistics average over them.
SWEEP = GridSweep(shapes={
    "small": {3: (4, 3, 7), 4: (2, 3, 3, 3), 5: (3, 3, 2, 1, 3)},
    "large": {3: (2, 3, 8193), 4: (2, 3, 91, 91), 5: (2, 3, 5, 41, 41)},
    "huge": {3: (1, 3, 65537), 4: (2, 3, 256, 257), 5: (1, 3, 16, 64, 65)},
})


def view(case) -> SetView:
    return SetView.per_group(case.shape, case.shape[1])  # one group per channel


def validate(case) -> None:
    if len(case.shape) < 3:
        raise UsageError(f"instancenorm needs spatial dims: shape N,C,L[,H[,W]], got {len(case.shape)}-D")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.running_mean, t.running_var, t.weight, t.bias, True, case.momentum, case.eps)


def reference_outputs(i) -> dict[str, np.ndarray]:
    c = i.case
    fwd = reference.instance_norm_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, c.momentum, c.eps)
    bwd = reference.instance_norm_backward(i.dy, i.x, i.weight, c.eps, has_bias=i.bias is not None)
    return drop_none(y=fwd.y, running_mean=fwd.running_mean, running_var=fwd.running_var, dx=bwd.dx,
                     dweight=bwd.dweight, dbias=bwd.dbias)


OP = Op(
    name="instancenorm",
    description="InstanceNorm: statistics per (sample, channel) over the spatial dims, running stats batch-averaged",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="channel",
    outputs=OUTPUTS, required=REQUIRED, sweep=SWEEP, running_stats=True, validate=validate,
    impls=(
        Impl("torch", "instancenorm", "torch.nn.functional.instance_norm (use_input_stats=True) through autograd",
             F.instance_norm),
    ),
)
