"""GroupNorm: statistics per (sample, group) over (C/G, spatial)."""
from __future__ import annotations

from math import prod

import numpy as np

from .. import reference
from ..core.errors import UsageError
from ..numerics.formats import NON_DENSE, standard_channels_last
from ..numerics.sets import SetView
from .batchnorm import drop_none
from .core import ALWAYS, CaseField, Impl, KnownIssue, Op, Signature, native_output_mask
from .forward_ad import forward_ad_issues
from .design import (BATCH_SCAN, SPATIAL_NEEDS_RANK, Design, Exclusion, Factor, Scan, at_most, channel_factor,
                     eps_factor, levels, nc_spatial, spatial_size)

SIGNATURE = "fn(input, num_groups, weight, bias, eps) -> Tensor  (torch.nn.functional.group_norm)"
OUTPUTS = ("y", "mean", "rstd", "dx", "dweight", "dbias")
REQUIRED = ("y", "dx", "dweight", "dbias")
DEFAULT_GROUPS = 3  # for cases built from options without --groups
GROUPS_FIELD = CaseField("groups", DEFAULT_GROUPS, "every case has G groups (the sweep's channels that G divides; "
                         "--one-case takes 3)", parse=int, metavar="G", label="G={}",
                         quiet=ALWAYS, convention=False, defaulted=False,
                         # (each count dividing C whose groups hold two values or more)
                         draw=lambda shape, op: [g for g in range(1, shape[1] + 1) if shape[1] % g == 0
                                                 and shape[1] // g * prod(shape[2:]) >= 2])


MAX_ELEMENTS = 1_200_000  # a case of at most this many elements takes well under a second


def _prime_divisor(c: int) -> int | None:
    """The smallest odd prime dividing C other than C itself (a group count that is neither 1, 2 nor C)."""
    return next((p for p in range(3, c) if c % p == 0 and all(p % q for q in range(2, p))), None)


GROUPS = {"1": lambda c: 1, "C": lambda c: c, "2": lambda c: 2 if c % 2 == 0 and c > 2 else None, "prime": _prime_divisor}


def _label(g: int, c: int) -> str:
    return "1" if g == 1 else "C" if g == c else "2" if g == 2 else "prime"


def _count(groups, c: int) -> int | None:
    """The group count a row's groups value gives with C channels: a label's, or a scan's count itself."""
    return groups if isinstance(groups, int) else GROUPS[groups](c)


def _groups_exist(c: int, groups) -> bool:
    """C has a group count of that kind (C = 1 has only G = 1; an odd prime G needs a C it divides), or a scanned
    count divides C."""
    g = _count(groups, c)
    return g is not None and c % g == 0 and (isinstance(groups, int) or _label(g, c) == groups)


def _shape(v: dict) -> dict:
    c = v["channels"]
    return {"shape": nc_spatial(v["batch"], c, v["spatial"], v["rank"]), "groups": _count(v["groups"], c)}


# The group count's own scan: G groups of two channels each (a grid of N·G sets, a vector of two per group)
GROUP_SCAN = Scan(limit=256, values=lambda g, usual: {"groups": g, "channels": 2 * g}, read=lambda c: c.groups)


SWEEP = Design(
    factors=(
        channel_factor(1, 3, 8, 12, 16, 64, 65),
        Factor("groups", levels(
            "1", "G = 1: one set per sample over every channel (LayerNorm2d's path)",
            "C", "G = C: one channel per group (InstanceNorm's path)",
            "2", "two groups of many channels: γ varies inside a group",
            "prime", "an odd prime number of groups (C/G not a power of two)",
        ), read=lambda case: _label(case.groups, case.channels), usual=2, field="groups", scan=GROUP_SCAN),
        Factor("spatial", levels(
            1, "no spatial extent: sets are channels only",
            7, "a few pixels: fewer than a vector",
            2047, "one below 2048, where torch's channels-last backward switches strategy",
            2048, "2048: the other strategy",
            2049, "one past 2048",
            16384, "long per-group reductions",
        ), read=spatial_size, usual=1),
        Factor("batch", levels(
            1, "one sample: fewer (sample, group) sets than threads",
            2, "two samples",
            3, "an odd batch",
        ), read=lambda c: c.shape[0], usual=1, scan=BATCH_SCAN),
        eps_factor(0.0, 1e-10, 1e-5, 1e-2),
    ),
    shape=_shape,
    exclusions=(
        Exclusion(("channels", "groups"), _groups_exist, "G = 2 needs an even C > 2, an odd prime G a C it divides; C = 1 is G = 1"),
        Exclusion(("groups", "spatial"), lambda g, s: not (g == "C" and s == 1), "a set of one value (G = C, no pixels)"),
        Exclusion(("channels", "spatial"), lambda c, s: c * s > 1, "a set of one value (one channel, no pixels)"),
        # (a 2-D input has no pixels: the same two sets of one value)
        Exclusion(("rank", "channels"), lambda rank, c: rank > 2 or c > 1, "a 2-D input of one channel: sets of one value"),
        Exclusion(("rank", "groups"), lambda rank, g: rank > 2 or g != "C", "a 2-D input with G = C: sets of one value"),
        SPATIAL_NEEDS_RANK,
        at_most(MAX_ELEMENTS // 3, "channels", "spatial", "a case of over 1.2M elements takes seconds"),
    ),
)


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
    import torch
    aten = torch.ops.aten
    n, c = case.shape[0], case.shape[1]
    hxw = prod(case.shape[2:])
    y, mean, rstd = aten.native_group_norm(t.x, t.weight, t.bias, n, c, hxw, case.groups, case.eps)
    dx, dw, db = aten.native_group_norm_backward(t.dy, t.x, mean, rstd, t.weight, n, c, hxw, case.groups,
                                                 native_output_mask(case))
    return {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dweight": dw, "dbias": db}


def native_layouts(case) -> str | None:
    if case.x_format in NON_DENSE:
        return "aten.native_group_norm requires x contiguous in a standard memory format (it raises otherwise)"
    return None


# ----------------------------------------------------------------------------- torch's known issues
CHANNELS_LAST_VARIANCE = KnownIssue(
    "torch-gn-channels-last-variance",
    "torch CPU group_norm on channels_last input computes the variance as E[x²] − E[x]²: catastrophic "
    "cancellation when |mean| ≫ std (f32 dx off by 1e7×, f64 off by ~1e-8 relative), and a variance that comes "
    "out negative gives NaN (f32, |mean| ~ 5e3, G = C = 3, 3x683 pixels: y NaN in 6147 of 12294 elements); small "
    "sets hit it by chance in any profile",
    lambda c: standard_channels_last(c.x_format, c.shape),
    # not dbias = Σ dy, which no variance enters; the second derivatives and the forward-mode ones (1x8x23x89 G=8 f64
    # near-constant, fwd-rev: jvp_y 9.3e3 budgets) are taken from the same statistics
    Signature(("y", "mean", "rstd", "dx", "dweight", "d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight"),
              nonfinite=True),
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
    "wrong gradients (autograd hides this by converting dy first; direct callers are exposed)",
    lambda c: c.dy_format != c.x_format,
    # Only direct callers: autograd converts dy first, so the kernel alone is no fingerprint (no `code`).
    Signature(("dx", "dweight", "dbias"), nonfinite=True),
)

NATIVE_EXPANDED_DY_OVERREAD = KnownIssue(
    "torch-gn-native-expanded-dy-overread",
    "aten.native_group_norm_backward reads an expanded dy (stride 0 along the batch: one sample's storage) as if "
    "laid out like x, past its storage's end: a second run can give other bits, and the process can die of "
    "SIGSEGV (3x65x2047 bf16 sliced x, expanded dy: once in CI, not on this machine's runs)",
    lambda c: c.dy_format == "expanded",
    # Only direct callers, as above. What lies past the storage decides which of the two is seen.
    Signature(message=r"^not deterministic: .* for (dx|dweight|dbias)|^died \(exit code -11, SIGSEGV\)"),
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
    lambda c: ("dx" not in c.grads and standard_channels_last(c.x_format, c.shape)
               and prod(c.shape[2:]) < 2048),
    Signature(message="SIGSEGV"),
    code=("aten.native_group_norm_backward",),
)

CREATE_GRAPH_HALF_PARAM_GRADS = KnownIssue(
    "torch-gn-create-graph-half-param-grads",
    "torch's group_norm backward under create_graph (grad mode on: a double backward follows) is a composite in "
    "the input dtype (infinitely_differentiable_native_group_norm_backward): the first-order dweight and dbias of "
    "f16/bf16 input, also with f32 parameters, are summed at input precision (bf16/f32 dbias 2179072 for 2170610); "
    "in plain f16 its intermediates overflow for |x| in the thousands, so dx and the second derivatives come back "
    "NaN although every exact one is representable (3x3x16384 G=3 f16, |mean| ~ 5e3)",
    lambda c: c.backward_differentiated and c.dtype in ("f16", "bf16"),
    Signature(("dx", "dweight", "dbias", "d2x", "d2weight", "d2dy", "jvp_dx", "jvp_dweight"), max_ratio=1e5,
              nonfinite=True),
    code=("aten.native_group_norm",),
)

# Found by --check batch-invariance (engine.invariance): the kernel's split of a sample's sums changes with the batch
CHANNELS_LAST_BATCH_VARIANCE = KnownIssue(
    "torch-gn-channels-last-batch-variance",
    "torch CPU group_norm on channels_last input partitions each sample's sums by the whole batch's size: a sample's "
    "y changes with the batch it is in (by 1 ulp in half precision, by millions of ulps in f32 where E[x²] − E[x]² "
    "cancels); contiguous input is batch invariant",
    lambda c: standard_channels_last(c.x_format, c.shape),
    Signature(message=r"^not batch invariant"),
    code=("aten.native_group_norm",),
)

# Found by the forward-mode paths (Case.order fwd, fwd-rev)
JVP_CHANNELS_LAST_VIEW = KnownIssue(
    "torch-gn-jvp-channels-last",
    "torch's group_norm forward-mode derivative (group_norm_jvp) views channels_last tangents as if they were "
    "contiguous: forward mode on channels_last or channels_last_3d input raises 'view size is not compatible with "
    "input tensor's size and stride'; contiguous input works",
    lambda c: c.forward_mode and standard_channels_last(c.x_format, c.shape),
    Signature(message=r"view size is not compatible with input tensor's size and stride"),
    code=("aten.native_group_norm",),
)

FWD_REV_CANCELLATION = KnownIssue(
    "torch-gn-fwd-rev-cancellation",
    "torch's forward-over-reverse of group_norm (the tangent of native_group_norm_backward) in f32 and half "
    "precision loses the second derivatives of sets whose |mean| ≫ std, where torch's own double backward of the "
    "same case is right (2x64 G=2 f32, |mean| ~ 1e4·std: jvp_dx −921.6 for −42.5, 24 budgets; d2x within 0.001)",
    lambda c: c.order == "fwd-rev" and c.dtype != "f64",
    Signature(("jvp_dx", "jvp_dweight")),
    code=("aten.native_group_norm",),
)

JVP_MIXED_DTYPE, HALF_FORWARD_AD = forward_ad_issues(
    "gn", "GroupNorm", "group_norm_jvp", "aten.native_group_norm",
    "3x1x32x64 G=1 f16, rows near √eps: jvp_y NaN for 0.0131")

TORCH_ISSUES = (CHANNELS_LAST_VARIANCE, F16_OVERFLOW, BIAS_WITHOUT_WEIGHT, FROZEN_X_CHANNELS_LAST_CRASH,
                CREATE_GRAPH_HALF_PARAM_GRADS, CHANNELS_LAST_BATCH_VARIANCE, JVP_CHANNELS_LAST_VIEW,
                FWD_REV_CANCELLATION, JVP_MIXED_DTYPE, HALF_FORWARD_AD)
# Found by the size-1 stride layouts (issue 41)
NATIVE_SIZE1_STRIDES_RAISE = KnownIssue(
    "torch-gn-native-size1-strides-raise",
    "aten.native_group_norm called directly raises 'Expected X.is_contiguous(memory_format) to be true' on a "
    "channels_last x with a size-1 dim at a non-canonical stride (2x3x1x7, strides (21, 1, 1, 3)), which "
    "x.is_contiguous(channels_last) accepts: it checks x against suggest_memory_format(), which reads the odd "
    "stride as contiguous (F.group_norm lays x out in that format first, and is right)",
    lambda c: 1 in c.shape and c.x_format == "channels_last_size1",
    Signature(message=r"Expected X\.is_contiguous\(memory_format\) to be true"),
)

NATIVE_ISSUES = TORCH_ISSUES + (NATIVE_DY_LAYOUT, NATIVE_EXPANDED_DY_OVERREAD, NATIVE_SIZE1_STRIDES_RAISE)

OP = Op(
    name="groupnorm",
    description="GroupNorm: statistics per (sample, group) over (C/G, spatial)",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="group",
    outputs=OUTPUTS, required=REQUIRED, saved_stats=("mean", "rstd"), sweep=SWEEP,
    fields=(GROUPS_FIELD,), set_dim=1, validate=validate,
    array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(
        Impl("torch", "groupnorm", "torch.nn.functional.group_norm through autograd", "torch.nn.functional:group_norm",
             known_issues=TORCH_ISSUES),
        Impl("torch-native-backward", "groupnorm",
             "aten.native_group_norm + aten.native_group_norm_backward called directly", native_backward,
             convention="direct", supports=native_layouts,
             capabilities="all dtypes; x in contiguous/channels_last/channels_last_3d (not strided or transposed), 2-D to 5-D",
             known_issues=NATIVE_ISSUES),
    ),
)
