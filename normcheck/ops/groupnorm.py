"""GroupNorm: statistics per (sample, group) over (C/G, spatial)."""
from __future__ import annotations

from math import prod

import numpy as np
import torch
import torch.nn.functional as F

from .. import reference
from ..core.errors import UsageError
from ..frameworks.torch import grad_mask
from ..numerics.sets import SetView
from .batchnorm import drop_none
from .core import GridSweep, Impl, KnownIssue, Op, Signature

SIGNATURE = "fn(input, num_groups, weight, bias, eps) -> Tensor  (torch.nn.functional.group_norm)"
OUTPUTS = ("y", "mean", "rstd", "dx", "dweight", "dbias")
REQUIRED = ("y", "dx", "dweight", "dbias")
DEFAULT_GROUPS = 3  # for cases built from options without --groups


def _sweep_fields(size: str, rank: int) -> dict:
    # small sets: C/G = 2 (2-D: 8); larger ones: C/G = 4 (2-D: the whole row is one group pair)
    return {"groups": ({"small": 6, "large": 2, "huge": 2} if rank == 2 else {"small": 3, "large": 2, "huge": 2})[size]}


# Sets of 8, 8192 (HxW = 2048: kernels that switch strategy on size) and 65536 elements, by input rank.
SWEEP = GridSweep(shapes={
    "small": {2: (3, 48), 3: (3, 6, 4), 4: (2, 6, 2, 2), 5: (2, 6, 2, 2, 1)},
    "large": {2: (2, 16384), 3: (2, 8, 2048), 4: (2, 8, 32, 64), 5: (2, 8, 8, 16, 16)},
    "huge": {2: (2, 131072), 3: (2, 8, 16384), 4: (2, 8, 128, 128), 5: (2, 8, 16, 32, 32)},
}, fields=_sweep_fields)


def view(case) -> SetView:
    return SetView.per_group(case.shape, case.groups)


def validate(case) -> None:
    if case.groups is None or case.groups < 1:
        raise UsageError("groupnorm needs --groups G with G >= 1")
    if case.shape[1] % case.groups:
        raise UsageError(f"C={case.shape[1]} is not divisible by groups={case.groups}")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, case.groups, t.weight, t.bias, case.eps)


ARRAY_SIGNATURE = "fn(x, weight, bias, *, num_groups, eps, channel_axis) -> y"


def array_call(fn, a, case):
    return fn(a.x, a.weight, a.bias, num_groups=case.groups, eps=case.eps, channel_axis=a.channel_axis)


def reference_outputs(i) -> dict[str, np.ndarray]:
    c = i.case
    fwd = reference.group_norm_forward(i.x, c.groups, i.weight, i.bias, c.eps)
    bwd = reference.group_norm_backward(i.dy, i.x, c.groups, i.weight, c.eps, has_bias=i.bias is not None)
    return drop_none(y=fwd.y, mean=fwd.mean, rstd=fwd.rstd, dx=bwd.dx, dweight=bwd.dweight, dbias=bwd.dbias)


def native_backward(case, t):
    """aten.native_group_norm, then aten.native_group_norm_backward called directly (no autograd)."""
    aten = torch.ops.aten
    n, c = case.shape[0], case.shape[1]
    hxw = prod(case.shape[2:])
    y, mean, rstd = aten.native_group_norm(t.x, t.weight, t.bias, n, c, hxw, case.groups, case.eps)
    dx, dw, db = aten.native_group_norm_backward(t.dy, t.x, mean, rstd, t.weight, n, c, hxw, case.groups,
                                                 grad_mask(case))
    return {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dweight": dw, "dbias": db}


def native_layouts(case) -> str | None:
    if case.x_format in ("strided", "transposed"):
        return "aten.native_group_norm requires x contiguous in a standard memory format (it raises otherwise)"
    return None


# ----------------------------------------------------------------------------- torch's known issues
CHANNELS_LAST_VARIANCE = KnownIssue(
    "torch-gn-channels-last-variance",
    "torch CPU group_norm on channels_last input computes the variance as E[x²] − E[x]²: catastrophic "
    "cancellation when |mean| ≫ std (f32 dx off by 1e7×, f64 off by ~1e-8 relative); small sets hit it "
    "by chance in any profile",
    lambda c: c.x_format in ("channels_last", "channels_last_3d"),
    # not dbias = Σ dy, which no variance enters; the second derivatives are taken from the same statistics
    Signature(("y", "mean", "rstd", "dx", "dweight", "d2x", "d2weight", "d2dy")),
    code=("aten.native_group_norm",),
)

F16_OVERFLOW = KnownIssue(
    "torch-gn-f16-overflow",
    "torch CPU group_norm backward in plain f16 accumulates per-channel Σ dy·x in f16: dweight overflows to inf "
    "for large |x|·|dy|·count although the true dweight is representable",
    # profiles with values of large magnitude (|x − mean|·|dy| ≫ 1): where f16 intermediates overflow
    lambda c: c.dtypes.dtype == "f16" and not c.dtypes.is_mixed and c.profile in ("offset", "heavy_tailed"),
    Signature(("dweight", "dbias"), max_ratio=100, nonfinite=True),
    code=("aten.native_group_norm_backward",),
)

NATIVE_DY_LAYOUT = KnownIssue(
    "torch-gn-native-dy-layout",
    "aten.native_group_norm_backward reads dy with x's memory format: a dy in another layout gives silently "
    "wrong gradients (autograd hides this by converting dy first; direct callers are exposed); an expanded dy "
    "(stride 0: one sample's storage) is read past its end, so a second run can give other bits",
    lambda c: c.dy_format != c.x_format,
    # Only direct callers: autograd converts dy first, so the kernel alone is no fingerprint (no `code`).
    Signature(("dx", "dweight", "dbias"), nonfinite=True, message=r"^not deterministic: .* for (dx|dweight|dbias)"),
)

BIAS_WITHOUT_WEIGHT = KnownIssue(
    "torch-gn-bias-without-weight",
    "torch CPU group_norm backward with a bias but no weight raises 'RuntimeError: tensor does not have a device' "
    "(aten.native_group_norm_backward asked for dbias without a weight; batch_norm and layer_norm take it), and its "
    "double backward raises \"shape '[0]' is invalid\"",
    lambda c: c.affine == "bias",
    Signature(message=r"tensor does not have a device|shape '\[0\]' is invalid for input"),
    code=("aten.native_group_norm_backward",),
)

FROZEN_X_CHANNELS_LAST_CRASH = KnownIssue(
    "torch-gn-frozen-x-channels-last-crash",
    "torch CPU group_norm backward on a channels_last / channels_last_3d input that does not require grad (only the "
    "weight or bias does: a frozen input) crashes the process with SIGSEGV when H·W < 2048 "
    "(aten.native_group_norm_backward with output_mask[0] False writes through its absent dx); any dtype",
    lambda c: "dx" not in c.grads and c.x_format in ("channels_last", "channels_last_3d") and prod(c.shape[2:]) < 2048,
    Signature(message="SIGSEGV"),
    code=("aten.native_group_norm_backward",),
)

CREATE_GRAPH_HALF_PARAM_GRADS = KnownIssue(
    "torch-gn-create-graph-half-param-grads",
    "torch's group_norm backward under create_graph (grad mode on: a double backward follows) is a composite in "
    "the input dtype (infinitely_differentiable_native_group_norm_backward): the first-order dweight and dbias of "
    "f16/bf16 input, also with f32 parameters, are summed at input precision (bf16/f32 dbias 2179072 for 2170610)",
    lambda c: c.order == 2 and c.dtype in ("f16", "bf16"),
    Signature(("dx", "dweight", "dbias"), max_ratio=1e4, nonfinite=True),
    code=("aten.native_group_norm",),
)

TORCH_ISSUES = (CHANNELS_LAST_VARIANCE, F16_OVERFLOW, BIAS_WITHOUT_WEIGHT, FROZEN_X_CHANNELS_LAST_CRASH,
                CREATE_GRAPH_HALF_PARAM_GRADS)
NATIVE_ISSUES = TORCH_ISSUES + (NATIVE_DY_LAYOUT,)

OP = Op(
    name="groupnorm",
    description="GroupNorm: statistics per (sample, group) over (C/G, spatial)",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="group",
    outputs=OUTPUTS, required=REQUIRED, saved_stats=("mean", "rstd"), sweep=SWEEP,
    case_fields={"groups": DEFAULT_GROUPS}, set_dim=1, validate=validate,
    array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(
        Impl("torch", "groupnorm", "torch.nn.functional.group_norm through autograd", F.group_norm,
             known_issues=TORCH_ISSUES),
        Impl("torch-native-backward", "groupnorm",
             "aten.native_group_norm + aten.native_group_norm_backward called directly", native_backward,
             convention="direct", supports=native_layouts,
             capabilities="all dtypes; x in contiguous/channels_last/channels_last_3d (not strided or transposed), 2-D to 5-D",
             known_issues=NATIVE_ISSUES),
    ),
)
