"""InstanceNorm: statistics per (sample, channel) over the spatial dims, running statistics averaged over the
batch (training); the running statistics for every instance in eval mode (use_input_stats=False)."""
from __future__ import annotations

import numpy as np

from .. import reference
from ..numerics.formats import CHANNELS_LAST, NON_DENSE, base_format
from ..numerics.sets import SetView
from .batchnorm import (RUNNING_STATS_FIELD, DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT, HALF_DOUBLE_BACKWARD, HALF_FORWARD_AD, JVP_MIXED_DTYPE,
                        call, drop_none)  # F.instance_norm's arguments are F.batch_norm's (use_input_stats: True)
from .core import Impl, KnownIssue, Op, Signature
from .design import BATCH_SCAN, MOMENTUM, Design, Factor, at_most, channel_factor, eps_factor, levels, nc_spatial

SIGNATURE = ("fn(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps) -> Tensor"
             "  (torch.nn.functional.instance_norm)")
OUTPUTS = ("y", "running_mean", "running_var", "dx", "dweight", "dbias")
REQUIRED = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")

MAX_ELEMENTS = 1_100_000  # a case of at most this many elements takes well under a second

# Sets are one instance's spatial values; the running statistics average over the batch.
SWEEP = Design(
    factors=(
        Factor("spatial", levels(
            3, "a few values: the instance-unbiased variance is 1/(S − 1) off",
            7, "a prime below a vector's width",
            2047, "one below 2048",
            8193, "one past 8192: kernels that switch strategy on the reduction length",
            65537, "past 65536: long reductions",
        ), read=lambda c: c.view.set_size, usual=1),
        channel_factor(1, 3, 8, 16, 65),
        Factor("batch", levels(
            1, "a batch of one: the (1, N·C, ...) view is x itself",
            3, "three instances: sums over the batch whose order matters",
            4, "running statistics averaged over four instances",
        ), read=lambda c: c.shape[0], usual=1, scan=BATCH_SCAN),
        eps_factor(0.0, 1e-10, 1e-5, 1e-2),
        MOMENTUM,
    ),
    shape=lambda v: {"shape": nc_spatial(v["batch"], v["channels"], v["spatial"], v["rank"])},
    exclusions=(at_most(MAX_ELEMENTS // 4, "spatial", "channels", "a case of over 1.1M elements takes seconds"),),
)


def view(case) -> SetView:
    return SetView.per_group(case.shape, case.shape[1])  # one group per channel


def reference_outputs(i) -> dict[str, np.ndarray]:
    c = i.case
    fwd = reference.instance_norm_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, c.momentum, c.eps)
    bwd = reference.instance_norm_backward(i.dy, i.x, i.weight, c.eps, has_bias=i.bias is not None)
    return drop_none(y=fwd.y, running_mean=fwd.running_mean, running_var=fwd.running_var, dx=bwd.dx,
                     dweight=bwd.dweight, dbias=bwd.dbias)


# ----------------------------------------------------------------------------- torch's known issues
# torch runs InstanceNorm as BatchNorm over x viewed as (1, N·C, *spatial), with γ, β and the running
# statistics repeated N times; the three issues below come from that construction. Their `code` is the BatchNorm
# kernels that construction runs: code that runs them (torch.nn.InstanceNorm2d, a subclass, F.instance_norm called from
# a layer) has them where torch's own record, run on the same case, fails alike (engine.compare.reproduced).
CONSTRUCTION = ("aten.native_batch_norm", "aten.native_batch_norm_backward")
BATCH_OF_ONE_DY_LAYOUT = KnownIssue(
    "torch-in-batch-of-one-channels-last-dy",
    "torch CPU instance_norm backward with a batch of one and a channels-last dy: the (1, C, *spatial) view of dy "
    "keeps its channels-last strides and aten.native_batch_norm_backward reads it with x's layout, so dx, dweight "
    "and dbias are silently wrong, in f64 too (dx off by 4 at 1x3x64x65); y is right, and N ≥ 2 is right",
    lambda c: c.shape[0] == 1 and base_format(c.dy_format) in CHANNELS_LAST,
    Signature(("dx", "dweight", "dbias"), nonfinite=True),
    code=CONSTRUCTION,
)

PER_INSTANCE_PARAM_GRADS = KnownIssue(
    "torch-in-per-instance-param-grads",
    "torch CPU instance_norm with f16/bf16 weight and bias: the repeated parameters get one gradient per instance, "
    "each rounded to the parameter dtype before the batch sum, so dweight/dbias lose u·Σ_n|per-instance sum| "
    "(bf16 dbias 16 for 7 at 2x3x3x3), and in f16 a per-instance Σ dy·x̂ above 65504 overflows to inf and NaN "
    "although the true gradient is representable",
    lambda c: c.param_dtype in ("f16", "bf16") and c.shape[0] > 1,
    Signature(("dweight", "dbias"), nonfinite=True),
    code=CONSTRUCTION,
)

MIXED_NO_AFFINE_RUNNING_STATS = KnownIssue(
    "torch-in-mixed-no-affine-running-stats",
    "torch CPU instance_norm with f16/bf16 input, f32 running statistics and no weight runs as a plain f16/bf16 "
    "norm: its statistics, and so y, dx and the running statistics, have the input's precision, not float32's "
    "(running_mean relative error 3e-4 in f16; 7e-8 with a weight, and in batch_norm without one); in f16 a running "
    "variance past 65504 overflows to inf (4x65x7, eps 0, momentum 1: inf for 65208)",
    lambda c: c.dtypes.is_mixed and not c.has_weight,
    Signature(("y", "dx", "running_mean", "running_var", "jvp_y"), nonfinite=True),
    code=CONSTRUCTION,
)

# Found by the calibration (docs/tolerance.md): a strided x or dy reaches the BatchNorm kernel with its
# strides (for a batch of one, or through dy), and that kernel's strided paths have BatchNorm's issues.
# A dy whose (1, N·C, *spatial) view keeps strides in no standard memory format, whatever N and C: pitched rows, and the
# last two dims swapped (a 4-D or 5-D transposed dy; a 3-D one's view needs a copy, which is contiguous)
def _dy_keeps_odd_strides(c) -> bool:
    return c.dy_format == "pitched" or (c.dy_format == "transposed" and len(c.shape) >= 4)


HALF_STRIDED = KnownIssue(
    "torch-in-half-strided",
    "torch CPU instance_norm backward in plain f16 with a batch of one or one channel and a strided or pitched x or "
    "dy, or with a pitched dy, or a transposed one of 4-D or 5-D, at any N and C: the (1, N·C, *spatial) views keep "
    "their strides and the BatchNorm kernel's strided path keeps its sums in f16 (torch-bn-f16-intermediates): dx "
    "overflows to inf/NaN for |x| ~ 1e3 although it is representable (3x1x65537 strided or pitched, 1x3x65537 "
    "pitched: dx NaN for 0.002; 3x16x23x89 with a pitched dy, found by InstanceNorm2d's default sweep: dx inf for "
    "-0.0024 on 92115 of 98256 elements, dweight and dbias NaN; its contiguous dy and a strided one are right, and so "
    "is a 3x2x65537 strided x)",
    lambda c: (c.dtype == "f16" and not c.dtypes.is_mixed
               and ((1 in c.shape[:2] and bool({"strided", "pitched"} & {c.x_format, c.dy_format}))
                    or _dy_keeps_odd_strides(c))),
    Signature(("dx", "dweight", "dbias"), nonfinite=True),
    code=CONSTRUCTION,
)

# Found with the one above: the mixed-precision path of a dy laid out so keeps dx's sums in f16 too
MIXED_HALF_STRIDED_DX = KnownIssue(
    "torch-in-mixed-f16-strided-dx",
    "torch CPU instance_norm backward with f16 input, f32 parameters and a dy in no standard memory format (strided, "
    "transposed or pitched) takes the BatchNorm kernel's mixed slow path (torch-bn-mixed-slow-path), which keeps dx's "
    "intermediate sums in f16: a whole instance's dx comes back ±inf for |x| ~ 1e3 although it is representable "
    "(3x16x23x89, a pitched or 4-D transposed dy: 2047 elements -inf for -0.023; 1x16x23x89 with a strided dy alike); "
    "dweight and dbias are right, and so is bf16",
    lambda c: c.dtype == "f16" and c.dtypes.is_mixed and c.dy_format in NON_DENSE,
    Signature(("dx",), max_ratio=1.0, nonfinite=True),  # (its overflow alone: the finite dx stays within the budget)
    code=CONSTRUCTION,
)

# Found by InstanceNorm2d's default sweep (issue 62), as PER_INSTANCE_PARAM_GRADS for the running statistics
PER_INSTANCE_RUNNING_STATS = KnownIssue(
    "torch-in-per-instance-running-stats",
    "torch CPU instance_norm in plain f16 (f16 running statistics) updates the repeated running statistics once per "
    "instance, (1 − m)·r + m·(the instance's statistic), each stored in f16 before the batch mean: an instance's "
    "update above 65504 overflows to inf although the mean is representable (3x65x1x7, |x| ~ 1e3, eps 0, momentum "
    "0.1: running_var inf for 52215.4, its three instances' updates 4118, 31270 and 121258; f32 running statistics "
    "give 52215.375)",
    lambda c: c.dtype == "f16" and c.param_dtype == "f16" and c.shape[0] > 1,
    Signature(("running_mean", "running_var"), max_ratio=1.0, nonfinite=True),  # (the overflow alone: each rounding
    # to f16 stays within the budget, 0.28 at worst over 64 generated cases)
    code=CONSTRUCTION,
)

MIXED_STRIDED_PARAM_GRADS = KnownIssue(
    "torch-in-mixed-strided-param-grads",
    "torch CPU instance_norm with bf16/f16 input, f32 parameters and a strided, transposed or pitched x or dy: the BatchNorm kernel's "
    "mixed-layout path (torch-bn-mixed-slow-path) rounds dweight and dbias to the input dtype (ratios up to 1e4)",
    lambda c: c.dtypes.is_mixed and bool(set(NON_DENSE) & {c.x_format, c.dy_format}),
    Signature(("dweight", "dbias")),
    code=CONSTRUCTION,
)

MIXED_BIAS_WITHOUT_WEIGHT = KnownIssue(
    "torch-in-mixed-bias-without-weight",
    "torch CPU instance_norm with f16/bf16 input and an f32 bias but no weight raises 'mixed dtype (CPU): expect "
    "parameter to have scalar type of Float' (the repeated bias reaches the BatchNorm kernel without a weight); "
    "batch_norm takes the same arguments",
    lambda c: c.dtypes.is_mixed and c.has_bias and not c.has_weight,
    Signature(message="expect parameter to have scalar type of Float"),
    code=CONSTRUCTION,
)

# Found by --check batch-invariance (engine.invariance)
BATCH_VARIANCE = KnownIssue(
    "torch-in-batch-variance",
    "torch CPU instance_norm is batch_norm over the (1, N·C, ...) reshape: its backward's per-channel sums are "
    "scheduled over all N·C channels, so a sample's dx changes with the batch it is in (any layout and dtype; y "
    "does not)",
    lambda c: True,
    Signature(message=r"^not batch invariant: dx "),
)

TORCH_ISSUES = (BATCH_OF_ONE_DY_LAYOUT, PER_INSTANCE_PARAM_GRADS, MIXED_NO_AFFINE_RUNNING_STATS, HALF_STRIDED,
                MIXED_HALF_STRIDED_DX, PER_INSTANCE_RUNNING_STATS, MIXED_STRIDED_PARAM_GRADS, MIXED_BIAS_WITHOUT_WEIGHT, HALF_DOUBLE_BACKWARD,
                DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT, BATCH_VARIANCE, JVP_MIXED_DTYPE, HALF_FORWARD_AD)

OP = Op(
    name="instancenorm",
    description="InstanceNorm: statistics per (sample, channel) over the spatial dims, running stats batch-averaged",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="channel",
    outputs=OUTPUTS, required=REQUIRED, sweep=SWEEP, running_stats=True, set_dim=-1, ranks=(3, 4, 5),
    fields=(RUNNING_STATS_FIELD,),
    impls=(
        Impl("torch", "instancenorm", "torch.nn.functional.instance_norm through autograd",
             "torch.nn.functional:instance_norm", known_issues=TORCH_ISSUES),
    ),
)
