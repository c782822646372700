"""BatchNorm in one process: per-channel statistics over (N, spatial) in training, the running ones in eval mode."""
from __future__ import annotations

import numpy as np

from .. import reference
from ..numerics.formats import NON_DENSE, base_format, standard_channels_last
from ..numerics.sets import SetView
from .core import CaseField, Impl, KnownIssue, Op, Signature, native_output_mask
from .forward_ad import forward_ad_issues
from .design import (MOMENTUM, Design, Factor, at_most, channel_factor,
                     eps_factor, levels, nc_spatial)

SIGNATURE = ("fn(input, running_mean, running_var, weight, bias, training, momentum, eps) -> Tensor"
             "  (torch.nn.functional.batch_norm)")
OUTPUTS = ("y", "mean", "invstd", "running_mean", "running_var", "dx", "dweight", "dbias")
REQUIRED = ("y", "dx", "dweight", "dbias", "running_mean", "running_var")

# torch refuses eps = 0 where it normalises with the batch's variance ("eps must be positive during training")
EPS_ZERO_MODES = ("eval",)
MAX_ELEMENTS = 1_100_000  # a case of at most this many elements takes well under a second


def _shape(v: dict) -> dict:
    """`set` elements per channel: a 2-D input's rows, else a batch of 2 (1 when odd) times the spatial size."""
    m, c, rank = v["set"], v["channels"], v["rank"]
    n = m if rank == 2 else (2 if m % 2 == 0 else 1)
    return {"shape": nc_spatial(n, c, m // n, rank)}


SWEEP = Design(
    factors=(
        Factor("set", levels(
            2, "the smallest set: the unbiased variance divides by 1",
            7, "a prime: no block or vector width divides it",
            1025, "one past 1024: a block's worth of elements and a tail",
            8193, "one past 8192: kernels that switch strategy on the reduction length",
            65536, "long reductions: error growth of sums, stagnation, cancellation",
        ), read=lambda c: c.view.set_size, usual=2),
        channel_factor(1, 3, 8, 16, 64, 65),
        eps_factor(0.0, 1e-10, 1e-5, 1e-2),
        MOMENTUM,
    ),
    shape=_shape,
    exclusions=(at_most(MAX_ELEMENTS, "set", "channels", "a case of over 1.1M elements takes seconds"),),
)


def view(case) -> SetView:
    return SetView.per_channel(case.shape)


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.running_mean, t.running_var, t.weight, t.bias, case.training, case.momentum, case.eps)


ARRAY_SIGNATURE = ("fn(x, weight, bias, running_mean, running_var, *, training, momentum, eps, channel_axis) -> "
                   "(y, running_mean, running_var)  (the new running statistics as torch defines them: "
                   "(1 − momentum)·old + momentum·batch, the batch variance unbiased)")


def array_call(fn, a, case):
    return fn(a.x, a.weight, a.bias, a.running_mean, a.running_var, training=case.training, momentum=case.momentum,
              eps=case.eps, channel_axis=a.channel_axis)


def reference_outputs(i) -> dict[str, np.ndarray]:
    """The whole batch on one device (SyncBN's reference too)."""
    c = i.case
    fwd = reference.batch_norm_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, c.momentum, c.eps)
    bwd = reference.batch_norm_backward(i.dy, i.x, i.weight, c.eps, has_bias=i.bias is not None)
    return drop_none(y=fwd.y, mean=fwd.mean, invstd=fwd.invstd, running_mean=fwd.running_mean,
                     running_var=fwd.running_var, dx=bwd.dx, dweight=bwd.dweight, dbias=bwd.dbias)


def drop_none(**arrays) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if v is not None}


def native_backward(case, t):
    """aten.native_batch_norm, then aten.native_batch_norm_backward called directly (no autograd); in eval
    mode both take the running statistics (and the saved ones are empty)."""
    import torch
    aten = torch.ops.aten
    y, mean, invstd = aten.native_batch_norm(t.x, t.weight, t.bias, t.running_mean, t.running_var, case.training,
                                             case.momentum, case.eps)
    dx, dw, db = aten.native_batch_norm_backward(t.dy, t.x, t.weight, t.running_mean, t.running_var, mean, invstd,
                                                 case.training, case.eps, native_output_mask(case))
    return {"y": y, "mean": mean, "invstd": invstd, "dx": dx, "dweight": dw, "dbias": db,
            "running_mean": t.running_mean, "running_var": t.running_var}


# ----------------------------------------------------------------------------- torch's known issues
MIXED_SLOW_PATH = KnownIssue(
    "torch-bn-mixed-slow-path",
    "torch CPU batch_norm backward with f16/bf16 input and f32 parameters, when x is strided, transposed or pitched (no "
    "standard memory format) or x and dy have different memory formats, rounds dweight/dbias (and intermediate "
    "dx terms) to the input dtype; in f16 those sums overflow past 65504 although every true result is representable "
    "(found by the pitched layouts: 2x8x32768 f16/f32, |mean| ≫ std, dy pitched, strided or transposed: dx −inf "
    "for 0.24 on every element)",
    lambda c: c.dtypes.is_mixed and (c.x_format != c.dy_format or bool(set(NON_DENSE) & {c.x_format, c.dy_format})),
    Signature(("dx", "dweight", "dbias"), max_ratio=1e5, nonfinite=True),  # bf16 rounding: at most u_bf16/u_f32 = 2^16
    code=("aten.native_batch_norm_backward",),
)

# Found by the class triples (issue 59): 2-value sets of small integers in plain f16 with eps = 1e-10
F16_TINY_EPS = 65504.0 ** -2  # below it, a set of zero variance has 1/sqrt(eps) past f16's largest value
F16_INVSTD_OVERFLOW = KnownIssue(
    "torch-bn-f16-invstd-overflow",
    "torch CPU batch_norm in plain f16 (f16 parameters) keeps invstd in f16: with eps below 65504^-2 (2.3e-10) a "
    "set of zero variance has 1/sqrt(eps) past 65504, invstd is inf and y = (x − mean)·invstd is 0·inf = NaN where "
    "it is exactly β (2x64 f16, sets of two equal integers, eps 1e-10: y NaN for 0.42); bf16 and mixed precision "
    "are right",
    lambda c: c.dtypes.dtype == "f16" and not c.dtypes.is_mixed and c.eps is not None and c.eps < F16_TINY_EPS,
    Signature(("y", "invstd", "dx", "dweight", "jvp_y"), nonfinite=True),
    code=("aten.native_batch_norm",),
)

F16_INTERMEDIATES = KnownIssue(
    "torch-bn-f16-intermediates",
    "torch CPU batch_norm backward in plain f16 (f16 parameters) keeps Σ dy·(x − mean) and other "
    "intermediates in f16: inf/NaN when |dy|·|x − mean|·count exceeds 65504 although every true result is "
    "representable; sums rounded in f16 on the channels-last, strided and mixed-layout paths (near-constant "
    "channels, 65536-element sets: dx errors 10× the budget)",
    lambda c: c.dtypes.dtype == "f16" and not c.dtypes.is_mixed,
    Signature(("dx", "dweight", "dbias"), max_ratio=100, nonfinite=True),
    code=("aten.native_batch_norm_backward",),
)

CHANNELS_LAST_F32_CANCELLATION = KnownIssue(
    "torch-bn-channels-last-f32-cancellation",
    "torch CPU batch_norm backward in f32 on channels_last input loses all accuracy when |mean| ≫ std and "
    "the set is large (dx 225 instead of 0.01 at 16x3x64x64 with |mean| ~ 5e3): Σ dy·(x − mean) is "
    "formed by cancellation; the forward's statistics lose accuracy the same way (y, running stats and "
    "dweight a few times over budget)",
    lambda c: c.dtypes.dtype == "f32" and standard_channels_last(c.x_format, c.shape),
    Signature(("y", "mean", "invstd", "running_mean", "running_var", "dx", "dweight")),  # not dbias = Σ dy
    code=("aten.native_batch_norm", "aten.native_batch_norm_backward"),
)

# Found by the size-1 stride layouts (issue 41): torch picks the channels-last kernel from
# x.is_contiguous(channels_last), which reads no stride of a size-1 dim, but lays dy out as suggest_memory_format()
# says, which does read them
SIZE1_STRIDES = KnownIssue(
    "torch-bn-size1-strides",
    "torch CPU batch_norm backward (training and eval) when x or dy is channels_last with a size-1 dim at a "
    "non-canonical stride (a batch of one or a spatial size of 1, as unsqueeze or a reshape's view leaves it) and the "
    "other is contiguous: suggest_memory_format() reads the odd stride as contiguous, so the kernel reads one of "
    "them in the other's layout and dx, dweight and dbias are silently wrong, in f64 too (1x8x1x3, x strides "
    "(1, 1, 1, 8), dy contiguous: dx off by 4.4, dbias by 3.9); y is right, and x and dy both channels-last are right",
    lambda c: (1 in c.shape and "channels_last_size1" in (c.x_format, c.dy_format)
               and {base_format(c.x_format), base_format(c.dy_format)} == {"channels_last", "contiguous"}),
    Signature(("dx", "dweight", "dbias")),
    # The kernel is right on such tensors laid out alike: code that hands it x and dy as the case lays them out (a
    # BatchNorm2d, F.batch_norm from a layer) meets it there, and is KNOWN only where torch's own record, run on the same
    # case, fails alike; code that lays them out otherwise itself is judged on what it returns
    code=("aten.native_batch_norm_backward",),
)


def double_backward_issues(op: str, name: str, formula: str, kernel: str, f16_example: str) -> tuple[KnownIssue, ...]:
    """The two failures of torch's composite double-backward formulas (BatchNorm's, LayerNorm's): f16
    overflow, and a bias without a weight. `op`: the key's op part; `kernel`: the aten backward op."""
    return (
        KnownIssue(
            f"torch-{op}-half-double-backward",
            f"torch's {name} double backward ({formula}, composite ops in the input dtype: f16/bf16 also with f32 "
            f"parameters) overflows in f16: d2x, d2weight and d2dy come back inf or NaN on large sets and "
            f"near-constant sets although every true second derivative is representable ({f16_example}); in bf16 "
            f"they lose all precision where they cancel (LayerNorm 1x1x65537x2 bf16, 2-element rows: d2dy 410 for "
            f"−0.48)",
            lambda c: c.order == 2 and c.dtype in ("f16", "bf16"),
            Signature(("d2x", "d2weight", "d2dy"), max_ratio=100, nonfinite=True),
            code=(kernel,),
        ),
        KnownIssue(
            f"torch-{op}-double-backward-bias-without-weight",
            f"torch's {name} double backward with a bias but no weight raises 'Expected a proper Tensor but got None "
            f"(or an undefined Tensor in C++) for argument #1 'other'' ({formula} uses the absent weight); with x "
            f"frozen it raises nothing but returns d2dy = 0 instead of ddβ. The first-order backward takes it",
            lambda c: c.order == 2 and c.has_bias and not c.has_weight,
            Signature(("d2dy",), message=r"Expected a proper Tensor but got None .*argument #1 'other'"),
            code=(kernel,),
        ),
    )


HALF_DOUBLE_BACKWARD, DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT = double_backward_issues(
    "bn", "BatchNorm", "batchnorm_double_backward", "aten.native_batch_norm_backward",
    "d2x -0.63 read as -inf at 16x3x64x64")

JVP_MIXED_DTYPE, HALF_FORWARD_AD = forward_ad_issues(
    "bn", "BatchNorm", "batch_norm_jvp", "aten.native_batch_norm",
    "2x8x1x1 f16, near-constant channels: jvp_y NaN for −238.1")

# A layer built with track_running_stats=False keeps none: no running_mean and running_var are passed or returned, and
# it normalises with the batch's statistics in every mode (so it has no eval mode of its own). A promise about its
# interface, as add + norm's `returns` is: a case takes the implementation's (its record's follows, --running-stats, or
# what its layer class says it has)
RUNNING_STATS_FIELD = CaseField(
    "running_stats", "yes", "whether the layer keeps running statistics: yes (the default) or none "
    "(track_running_stats=False: none are passed or returned, and it has no eval mode)", choices=("yes", "none"),
    label="running-stats={}", quiet="yes", probes=(),
    meanings={"yes": "keeps running statistics", "none": "keeps no running statistics"})

TORCH_ISSUES = (MIXED_SLOW_PATH, F16_INTERMEDIATES, F16_INVSTD_OVERFLOW, CHANNELS_LAST_F32_CANCELLATION, SIZE1_STRIDES,
                HALF_DOUBLE_BACKWARD, DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT, JVP_MIXED_DTYPE, HALF_FORWARD_AD)

OP = Op(
    name="batchnorm",
    description="BatchNorm, one process: per-channel statistics over (N, spatial); running ones in eval mode",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="channel",
    outputs=OUTPUTS, required=REQUIRED, saved_stats=("mean", "invstd"), running_stats=True, sweep=SWEEP,
    eps_zero=EPS_ZERO_MODES, fields=(RUNNING_STATS_FIELD,),
    rows_depend=lambda c: ("training BatchNorm normalises by the batch's own statistics: each row's output depends "
                           "on every row" if c.training else None),
    array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(
        Impl("torch", "batchnorm", "torch.nn.functional.batch_norm through autograd", "torch.nn.functional:batch_norm",
             known_issues=TORCH_ISSUES),
        Impl("torch-native-backward", "batchnorm",
             "aten.native_batch_norm + aten.native_batch_norm_backward called directly", native_backward,
             convention="direct", known_issues=TORCH_ISSUES),
    ),
)
