"""LayerNorm: statistics per row over the last k dims (normalized_shape), γ and β per element of them."""
from __future__ import annotations

import numpy as np

from .. import reference
from ..core.errors import UsageError
from ..numerics.sets import SetView
from .batchnorm import double_backward_issues, drop_none
from . import fp8
from .core import ALWAYS, CaseField, Impl, KnownIssue, Op, Signature, native_output_mask
from .forward_ad import forward_ad_issues
from .design import Design, Exclusion, Factor, at_most, eps_factor, levels, spread
from .layouts import HIDDEN as HIDDEN_AXIS

SIGNATURE = ("fn(input, normalized_shape, weight, bias, eps) -> Tensor  (torch.nn.functional.layer_norm); with "
             f"--fp8: fn(..., eps, {fp8.KEYWORDS}) -> {fp8.RETURNS}")
OUTPUTS = ("y", "mean", "rstd", "dx", "dweight", "dbias")
REQUIRED = ("y", "dx", "dweight", "dbias")

MAX_ELEMENTS = 1_200_000  # a case of at most this many elements takes well under a second

# Rows and the hidden size H = prod(normalized_shape) are what row-wise kernels dispatch on: a one-row
# decode path, a split of one long row over blocks, vector lanes and their tails, block limits.
ROWS = Factor("rows", levels(
    1, "one row: the decode path, and a long row split over blocks; dγ is one row's products",
    2, "two rows",
    7, "a prime number of rows",
    256, "a whole number of row tiles (2^k rows per program): the grid has no partial tile",
    257, "one past 256: a last tile of one row, where per-tile slots or partial sums sized rows // tile overflow",
    65537, "past 65536 rows: dγ and dβ are long sums over rows, grids of many blocks",
), read=lambda c: c.view.set_count, usual=2)
HIDDEN = Factor("hidden", levels(
    1, "H = 1: x̂ = 0, y = β, dx = 0",
    2, "H = 2: x̂ = ±1",
    7, "a prime below a vector's width",
    16, "a whole 16-lane vector (and 4 and 8)",
    17, "one past it: the scalar tail",
    1024, "exactly 1024: a power-of-two tile holds the row with no masked tail",
    1025, "one past 1024: a block and a tail",
    2049, "one past 2048",
    4095, "one below 4096",
    4096, "exactly 4096: the single-block limit reached, no tail",
    4097, "one past 4096",
    8193, "one past 8192: past single-block kernels",
    16385, "one past 16384",
    40009, "one long row (a prime past 40000): split over blocks",
), read=lambda c: c.view.set_size, usual=3)
DIMS = Factor("normalized_dims", levels(
    1, "normalized_shape of one dim", 2, "of two dims (as flattened by kernels)", 3, "of three dims",
), read=lambda c: c.normalized_dims, field="normalized_dims")
ROW_TILES = (256, 257)
ROW_EXCLUSIONS = (
    Exclusion(("rank", "normalized_dims"), lambda rank, k: k < rank, "the rows need a dim of their own"),
    Exclusion(("rows", "hidden"), lambda rows, h: rows not in ROW_TILES or h <= 1025,
              "the row-tile levels at a modest row length: the tile boundary, not the size, is what they test"),
    at_most(MAX_ELEMENTS, "rows", "hidden", "a case of over 1.2M elements takes seconds"),
)


def rows_shape(v: dict) -> dict:
    """The shape of a case of `rows` rows of `hidden` values over K dims; channels-first (a convention the
    implementation follows, in `v` when it does): the K dims right after N, the rows over N and the dims after."""
    k, rank = v["normalized_dims"], v["rank"]
    rows, hidden = spread(v["rows"], rank - k), spread(v["hidden"], k)
    if v.get("normalized_at") == "channels":
        return {"shape": rows[:1] + hidden + rows[1:], "normalized_dims": k}
    return {"shape": rows + hidden, "normalized_dims": k}


SWEEP = Design(
    factors=(ROWS, HIDDEN, DIMS, eps_factor(0.0, 1e-10, 1e-5, 1e-2)),
    shape=rows_shape,
    exclusions=ROW_EXCLUSIONS + (
        Exclusion(("eps", "hidden"), lambda eps, h: eps != 0 or h > 2, "eps = 0 with rows of 1 or 2 values: "
                  "zero variance (two values can round equal)"),),
)


# Which K dims a set spans (Case.normalized_at, a convention): the last K (F.layer_norm), or dims 1..K of
# (N, C, ...) input (channels-first: ConvNeXt's and ViTDet's LayerNorm2d)
NORMALIZED_AT = ("trailing", "channels")
NORMALIZED_DIMS_FIELD = CaseField("normalized_dims", 1, "how many dims a set spans: every case spans K (the sweep covers "
                                  "1, 2 and 3; --one-case takes 1, the last)", parse=int,
                                  metavar="K", label="D={}", quiet=ALWAYS, convention=False,
                                  # (1 to 3 of the dims after N; one where a layout splits the hidden dim)
                                  draw=lambda shape, op: (1,) if op.layout is not None and op.layout.axis == HIDDEN_AXIS
                                  else range(1, min(3, len(shape) - 1) + 1))
NORMALIZED_AT_FIELD = CaseField(
    "normalized_at", "trailing", "which K dims a set spans: trailing (the last K, F.layer_norm; the default) or "
    "channels (dims 1..K of N, C, ... input: channels-first, as ConvNeXt's LayerNorm2d)", choices=NORMALIZED_AT,
    label="set={}", quiet="trailing", meanings={"trailing": "normalises the last K dims",
                                                "channels": "normalises dims 1..K (channels-first)"})


def channels_first(case) -> bool:
    return case.normalized_at == "channels"


def normalized_shape(case) -> tuple[int, ...]:
    k = case.normalized_dims
    return tuple(case.shape[1:1 + k] if channels_first(case) else case.shape[len(case.shape) - k:])


def view(case) -> SetView:
    dims = SetView.leading_dims if channels_first(case) else SetView.last_dims
    return dims(case.shape, case.normalized_dims)


def validate(case) -> None:
    k, rank = case.normalized_dims, len(case.shape)
    if channels_first(case) and k is not None and not 1 <= k < rank:
        raise UsageError(f"{case.op} channels-first normalises dims 1..K of the {rank}-D input: 1 <= K <= {rank - 1} "
                         f"(--normalized-dims), not {k}")
    if k is None or not 1 <= k <= rank:
        raise UsageError(f"{case.op} needs normalized_dims K (--normalized-dims) with 1 <= K <= {rank} "
                         "(the input's dims)")


def as_trailing(case, a: np.ndarray) -> np.ndarray:
    """An x-shaped array with the normalised dims last (the reference's layout); as_given undoes it."""
    k = case.normalized_dims
    return np.moveaxis(a, range(1, 1 + k), range(a.ndim - k, a.ndim)) if channels_first(case) else a


def as_given(case, a: np.ndarray) -> np.ndarray:
    k = case.normalized_dims
    return np.moveaxis(a, range(a.ndim - k, a.ndim), range(1, 1 + k)) if channels_first(case) else a


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, t.bias, case.eps, **fp8.keywords(t, case))


ARRAY_SIGNATURE = ("fn(x, weight, bias, *, axes, eps) -> y  (axes: the normalised ones, (-K, ..., -1); "
                   "channels-first: (1, ..., K))")


def normalized_axes(case) -> tuple[int, ...]:
    k = case.normalized_dims
    return tuple(range(1, 1 + k)) if channels_first(case) else tuple(range(-k, 0))


def array_call(fn, a, case):
    fp8.refuse_arrays(case)
    return fn(a.x, a.weight, a.bias, axes=normalized_axes(case), eps=case.eps)


def forward(i) -> np.ndarray:
    """The reference's y alone."""
    c = i.case
    return as_given(c, reference.layer_norm_forward(as_trailing(c, i.x), normalized_shape(c), i.weight, i.bias, c.eps).y)


def reference_outputs(i) -> dict[str, np.ndarray]:
    c, d = i.case, normalized_shape(i.case)
    x, dy = as_trailing(c, i.x), as_trailing(c, i.dy)
    fwd = reference.layer_norm_forward(x, d, i.weight, i.bias, c.eps)
    bwd = reference.layer_norm_backward(dy, x, d, i.weight, c.eps, has_bias=i.bias is not None)
    y = as_given(c, fwd.y)
    return drop_none(y=y, mean=as_given(c, fwd.mean), rstd=as_given(c, fwd.rstd),
                     dx=as_given(c, bwd.dx), dweight=bwd.dweight, dbias=bwd.dbias)


def native_backward(case, t):
    """aten.native_layer_norm, then aten.native_layer_norm_backward called directly (no autograd),
    with the output mask asking for exactly the gradients the case asks for."""
    import torch
    aten = torch.ops.aten
    d = list(normalized_shape(case))
    y, mean, rstd = aten.native_layer_norm(t.x, d, t.weight, t.bias, case.eps)
    dx, dw, db = aten.native_layer_norm_backward(t.dy, t.x, d, mean, rstd, t.weight, t.bias, native_output_mask(case))
    return {"y": y, "mean": mean, "rstd": rstd, "dx": dx, "dweight": dw, "dbias": db}


# ----------------------------------------------------------------------------- torch's known issues
HALF_PARAM_GRADS = KnownIssue(
    "torch-ln-half-param-grads",
    "torch CPU layer_norm backward with f16/bf16 input sums dweight and dbias over the rows in the input "
    "dtype, also with f32 parameters: relative errors of 1e-2 to 4e-1 over 4k to 65k rows (bf16), where "
    "rounding the exact answer costs 2e-3 (and 5e-8 in f32); in f16 the sums overflow to inf where the "
    "true gradient is finite (> 65504); dx is right",
    lambda c: c.dtype in ("f16", "bf16"),
    Signature(("dweight", "dbias"), nonfinite=True),
    code=("aten.native_layer_norm_backward",),
)

TINY_ROW_STATISTICS = KnownIssue(
    "torch-ln-tiny-row-statistics",
    "torch CPU layer_norm in f32 computes the statistics of rows of a few elements far less accurately than "
    "a two-pass variance when |mean| ≫ std: rstd relative error 1.2e-3 at 2 elements and |mean| = 500·std "
    "(two-pass f32: 1.2e-5), 2e-2 at 5000·std (3e-3); the dx of 2-element rows (an exact cancellation) then "
    "lands outside even its wide budget. Half input with f32 parameters runs the same float32 kernel: its dx inherits "
    "the error and, stored in f16, overflows where the true dx lies near f16's range (28672x2 f16/f32 offset: dx −inf "
    "for −54058; f32: −65536). (In f64 its double backward and forward-over-reverse on 2-element rows, once "
    "recorded here at 18 budgets, write invstd's tangent with the tangent uncentred: within that spelling's rounding, "
    "docs/tolerance.md, Forward mode)",
    lambda c: c.view.set_size <= 4 and (c.dtype == "f32" or (c.dtypes.is_mixed and c.param_dtype == "f32")),
    Signature(("y", "mean", "rstd", "dx", "dweight", "d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight"),
              nonfinite=True),
    code=("aten.native_layer_norm",),
)

F16_RSTD_OVERFLOW = KnownIssue(
    "torch-ln-f16-rstd-overflow",
    "torch CPU layer_norm backward with plain f16 input (f16 parameters) holds rstd in f16: where σ² + eps < 2.3e-10 "
    "(rows of one value, or constant rows, with eps ≤ 2e-10) rstd = 1/sqrt(σ² + eps) > 65504 becomes inf and dx and "
    "dweight come back NaN, although dx is 0 there (4x1 f16, eps = 1e-10: dx NaN for 0); f16 with f32 parameters, "
    "bf16 and eps = 1e-9 are right",
    lambda c: c.dtype == "f16" and c.param_dtype == "f16" and c.eps_value < 2.4e-10,
    Signature(("dx", "dweight"), nonfinite=True),
    code=("aten.native_layer_norm_backward",),
)

MIXED_BIAS_WITHOUT_WEIGHT = KnownIssue(
    "torch-ln-mixed-bias-without-weight",
    "torch CPU layer_norm backward with f16/bf16 input, an f32 bias and no weight raises 'expected scalar type Half "
    "(BFloat16) but found Float'; the forward, and a weight without a bias, work",
    lambda c: c.dtypes.is_mixed and c.affine == "bias",
    Signature(message="expected scalar type (Half|BFloat16) but found Float"),
    code=("aten.native_layer_norm_backward",),
)

HALF_DOUBLE_BACKWARD, DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT = double_backward_issues(
    "ln", "LayerNorm", "layer_norm_double_backward", "aten.native_layer_norm_backward",
    "d2x -78.9 read as NaN at 2x2x4x32x33")

JVP_MIXED_DTYPE, HALF_FORWARD_AD = forward_ad_issues(
    "ln", "LayerNorm", "layer_norm_jvp", "aten.native_layer_norm", "7x16 f16, rows near √eps: jvp_y NaN for −43.5")

# Found by --check batch-invariance (engine.invariance)
HALF_FWD_REV_BATCH_VARIANCE = KnownIssue(
    "torch-ln-half-fwd-rev-batch-variance",
    "torch CPU F.layer_norm's forward-over-reverse (the JVP of its backward, forward-mode AD through autograd's "
    "formula) in float16 and bfloat16 orders its reductions by the whole tensor: a row's dx changes by about 1.5 ulps "
    "with the batch it is in (1x257x17 bf16: as row 479 of 480); the first order, forward mode and float32 are "
    "invariant on the same cases",
    lambda c: c.dtype in ("f16", "bf16") and c.order == "fwd-rev",
    Signature(message=r"^not batch invariant"),
)

# Found by the budgeted search (issue 59): no default sweep has an f64 row of one value with |x| ≫ sqrt(eps)
F64_ONE_VALUE_ROWS = KnownIssue(
    "torch-ln-f64-one-value-rows",
    "torch CPU layer_norm backward in f64 forms dx as rstd·γ·dy + b·x + c, whose last two terms cancel: on rows of one "
    "value (x̂ = 0, dx exactly 0) with |x| in the thousands and eps = 1e-10 (rstd = 1e5) they leave dx ~ 1e-6 "
    "(65537x1, |mean| ≫ std: 32 budgets; 16x1: 2.6 to 7.8); f32 rows of a few values are "
    "torch-ln-tiny-row-statistics",
    lambda c: c.dtype == "f64" and c.view.set_size == 1,
    Signature(("dx",)),
    code=("aten.native_layer_norm_backward",),
)

TORCH_ISSUES = (HALF_PARAM_GRADS, TINY_ROW_STATISTICS, F64_ONE_VALUE_ROWS, F16_RSTD_OVERFLOW, MIXED_BIAS_WITHOUT_WEIGHT, HALF_DOUBLE_BACKWARD,
                DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT, JVP_MIXED_DTYPE, HALF_FORWARD_AD, HALF_FWD_REV_BATCH_VARIANCE)

TORCHS = {"normalized_at": "trailing"}  # torch's convention: the last K dims


def layer_norm_fp8(input, normalized_shape, weight=None, bias=None, eps=1e-5, *, scale, fp8_dtype):
    """F.layer_norm, then y quantised in torch (fp8.quantised)."""
    import torch.nn.functional as F
    return fp8.quantised(F.layer_norm(input, normalized_shape, weight, bias, eps), scale, fp8_dtype)

OP = Op(
    name="layernorm",
    description="LayerNorm: statistics per row over the last K dims, γ and β per element of them",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=REQUIRED, saved_stats=("mean", "rstd"), sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD, NORMALIZED_AT_FIELD, fp8.FIELD), set_dim=-1, validate=validate,
    array_signature=ARRAY_SIGNATURE, array_call=array_call, channels=False,
    min_set_size=1,  # a hidden size of 1 is a layer too: x̂ = 0, y = β, dx = 0
    extensions=(fp8.extension(forward),),
    impls=(
        Impl("torch", "layernorm", "torch.nn.functional.layer_norm through autograd", "torch.nn.functional:layer_norm",
             known_issues=TORCH_ISSUES, follows={**TORCHS, "fp8": None}),
        Impl("torch-native-backward", "layernorm",
             "aten.native_layer_norm + aten.native_layer_norm_backward called directly", native_backward,
             convention="direct", known_issues=TORCH_ISSUES, follows={**TORCHS, "fp8": None}),
        *(Impl(f"torch-fp8-{f}", "layernorm", f"torch.nn.functional.layer_norm through autograd, y quantised to "
               f"{fp8.TORCH_NAMES[f]} in torch", layer_norm_fp8, known_issues=TORCH_ISSUES,
               follows={**TORCHS, "fp8": f}) for f in fp8.FP8_FORMATS),
    ),
)
