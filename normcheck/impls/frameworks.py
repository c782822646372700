"""The records of other frameworks' layers (flax, Keras) and of torch.compile: data only, no framework imported
here. Each target is a `module:attr` loaded where the implementation runs (normcheck.impls.flax_layers,
keras_layers, compiled), so listing them needs none of those frameworks installed.
"""
from __future__ import annotations

from dataclasses import replace

from ..frameworks.arrays import formats_of
from ..ops import OPS, Impl, KnownIssue, Signature
from ..ops.core import SECOND_DERIVATIVES
from ..ops.layernorm import TORCHS as LN_TORCHS  # (their LayerNorm and RMSNorm follow torch's conventions: the last
from ..ops.rmsnorm import TORCHS as RMS_TORCHS   # K axes; w as given, rounded once at the end)

# The versions the deviations below were found and reproduced with (tests/test_frameworks.py checks them there)
RECORDED_WITH = {"flax": "0.12", "keras": "3.15", "tensorflow": "2.21"}

_FLAX = "normcheck.impls.flax_layers"
_KERAS = "normcheck.impls.keras_layers"


def _array_impl(name: str, op: str, description: str, target: str, framework: str, **fields) -> Impl:
    formats = formats_of(OPS[op])
    fields.setdefault("capabilities", f"all dtypes; x and dy {' or '.join(formats)} (arrays have no strides)")
    return Impl(name, op, description, target, framework=framework, formats=formats, **fields)


# ----------------------------------------------------------------------------- flax's deviations (flax 0.12, jax 0.10)
# all but Σ dy and the mean (and forward mode's tangents of them)
_STATISTICS_DERIVED = ("y", "dx", "dweight", "running_var", "d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight")
_HALF = ("f16", "bf16")

FLAX_FAST_VARIANCE = KnownIssue(
    "flax-fast-variance",
    "flax's BatchNorm, GroupNorm and LayerNorm (linen and nnx; use_fast_variance=True, the default) compute the "
    "variance as E[x²] − E[x]² (clipped at 0): catastrophic cancellation when |mean| ≫ std, in every dtype, in y, "
    "in dx and dγ (autodiff differentiates the same formula) and the running variance (LayerNorm 65537x6 f32, "
    "offset rows: dx 1.19e11 for −9.50; f64 near-constant rows: dx 6.6e3 budgets; clipped to 0 with eps = 0, y and "
    "its tangent inf). use_fast_variance=False is the two-pass formula",
    lambda c: c.training,
    Signature(_STATISTICS_DERIVED, nonfinite=True),
)



def biased_running_var(key: str, layer: str, variable: str) -> KnownIssue:
    """The running-variance convention of TensorFlow-era frameworks: the batch's biased variance."""
    return KnownIssue(
        key,
        f"{layer} updates {variable} with the biased batch variance Σ(x − μ)²/n where torch's definition uses the "
        "unbiased one, /(n − 1): running_var low by the factor (n − 1)/n (8x3: 12.5% of the batch term)",
        lambda c: c.training,
        Signature(("running_var",)),
    )


FLAX_BIASED_RUNNING_VAR = biased_running_var("flax-bn-biased-running-var", "flax's BatchNorm", "the running variance")

FLAX_HALF_RUNNING_STATS = KnownIssue(
    "flax-bn-half-running-stats-become-f32",
    "flax.linen.BatchNorm with f16/bf16 running statistics (batch_stats in half precision) returns them in float32 "
    "after a training step: the update is computed in float32 and not cast back, so the state changes dtype",
    lambda c: c.training and c.param_dtype in _HALF,
    Signature(message=r"running_(mean|var) has dtype float32, expected (float16|bfloat16)"),
)

FLAX_EVAL_HALF = KnownIssue(
    "flax-bn-eval-half-precision",
    "flax.linen.BatchNorm in eval mode (use_running_average) with f16/bf16 running statistics normalises in the "
    "input dtype (no float32 statistics to promote to), so dγ and dβ are sums of half-precision products in half "
    "precision (bf16 dβ −374 for −342.5 at 16x3x64x64)",
    lambda c: not c.training and c.param_dtype in _HALF,
    Signature(("dweight", "dbias"), nonfinite=True),
)

NNX_F32_BATCH_STATS = KnownIssue(
    "flax-nnx-bn-f32-batch-stats",
    "flax.nnx.BatchNorm keeps its running statistics in float32 whatever param_dtype says (its BatchStat variables "
    "are created float32): f64 running statistics are rounded to float32, f16/bf16 ones come back float32",
    lambda c: c.param_dtype != "f32",
    Signature(message=r"running_(mean|var) has dtype float32, expected"),
)

NNX_HALF_PARAMS = KnownIssue(
    "flax-nnx-half-params",
    "flax.nnx's normalization layers promote x, the statistics and the float32 parameters to the layer's dtype "
    "(the input's, as mixed precision configures it) before normalising: x̂, dx and the sums of dγ and dβ are "
    "computed in f16/bf16 (bf16 LayerNorm dβ ratios to 9e3, RMSNorm dx 212 budgets), and f16 sums overflow to inf "
    "(dβ inf for 1781007.75)",
    lambda c: c.dtype in _HALF,
    Signature(("y", "dx", "dweight", "dbias", "d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight"),
              nonfinite=True),
)

FLAX_SYNC_UNWEIGHTED_MEAN = KnownIssue(
    "flax-syncbn-unweighted-device-mean",
    "flax's BatchNorm(axis_name=...) averages the devices' masked means with lax.pmean, one weight per device "
    "whatever its number of rows: with uneven shares the statistics are not the batch's (f32 split 1,2,3,2: y "
    "−2182 for −3.08), and an empty device's mean is 0/0 = NaN, which pmean spreads to every device",
    lambda c: c.training and c.split is not None and len(set(c.split)) > 1,
    Signature(("y", "dx", "dweight", "running_mean", "running_var"), nonfinite=True),
)

FLAX_RMS_HALF_SECOND_ORDER = KnownIssue(
    "flax-rms-half-second-order",
    "flax's RMSNorm (linen and nnx) with f16 input: its second derivatives (x·rsqrt(mean(x²) + eps) differentiated "
    "twice by jax: the double backward, and forward-over-reverse) come back NaN or inf where every exact second "
    "derivative is within f16's range and a textbook RMSNorm through the same adapter passes (65537 rows of one "
    "value, eps = 1e-10, no weight: d2x NaN for 35597)",
    lambda c: c.backward_differentiated and c.dtype == "f16",
    Signature(SECOND_DERIVATIVES, nonfinite=True),
)

_LINEN_BN = (FLAX_FAST_VARIANCE, FLAX_BIASED_RUNNING_VAR, FLAX_HALF_RUNNING_STATS, FLAX_EVAL_HALF)

FLAX = (
    _array_impl("flax", "batchnorm", "flax.linen.BatchNorm (jax.jit, gradients by jax.vjp)", f"{_FLAX}:batch_norm",
                "jax", known_issues=_LINEN_BN),
    _array_impl("flax-nnx", "batchnorm", "flax.nnx.BatchNorm (its own statistics code: dtype promotion differs from "
                "linen)", f"{_FLAX}:nnx_batch_norm", "jax",
                known_issues=(FLAX_FAST_VARIANCE, FLAX_BIASED_RUNNING_VAR, NNX_F32_BATCH_STATS, NNX_HALF_PARAMS)),
    _array_impl("flax", "groupnorm", "flax.linen.GroupNorm (channels last; NCHW input moved to NHWC and back)",
                f"{_FLAX}:group_norm", "jax", known_issues=(FLAX_FAST_VARIANCE,)),
    _array_impl("flax", "layernorm", "flax.linen.LayerNorm over the last K axes", f"{_FLAX}:layer_norm", "jax",
                follows=LN_TORCHS, known_issues=(FLAX_FAST_VARIANCE,)),
    _array_impl("flax-nnx", "layernorm", "flax.nnx.LayerNorm over the last K axes", f"{_FLAX}:nnx_layer_norm", "jax",
                follows=LN_TORCHS, known_issues=(FLAX_FAST_VARIANCE, NNX_HALF_PARAMS)),
    _array_impl("flax-nnx", "groupnorm", "flax.nnx.GroupNorm (channels last; NCHW input moved to NHWC and back)",
                f"{_FLAX}:nnx_group_norm", "jax", known_issues=(FLAX_FAST_VARIANCE, NNX_HALF_PARAMS)),
    _array_impl("flax", "rmsnorm", "flax.linen.RMSNorm over the last K axes", f"{_FLAX}:rms_norm", "jax",
                follows=RMS_TORCHS, known_issues=(FLAX_RMS_HALF_SECOND_ORDER,)),
    _array_impl("flax-nnx", "rmsnorm", "flax.nnx.RMSNorm over the last K axes", f"{_FLAX}:nnx_rms_norm", "jax",
                follows=RMS_TORCHS, known_issues=(NNX_HALF_PARAMS, FLAX_RMS_HALF_SECOND_ORDER)),
    _array_impl("flax", "syncbn", "flax.linen.BatchNorm(axis_name=...) under shard_map over simulated host devices, "
                "uneven shares padded with a row mask", f"{_FLAX}:batch_norm", "jax", world="jax-devices",
                worlds=("jax-devices",),
                known_issues=(*_LINEN_BN, FLAX_SYNC_UNWEIGHTED_MEAN)),
)

# ----------------------------------------------------------------------------- Keras' deviations (Keras 3.15, TF 2.21)
KERAS_BIASED_RUNNING_VAR = biased_running_var("keras-bn-biased-moving-variance", "keras.layers.BatchNormalization",
                                              "moving_variance")

KERAS_SYNC_FAST_VARIANCE = KnownIssue(
    "keras-syncbn-fast-variance",
    "keras.layers.BatchNormalization(synchronized=True) computes the variance from all-reduced sums as "
    "E[x²] − E[x]² (clipped at 0), where the unsynchronised layer subtracts the mean first: catastrophic "
    "cancellation when |mean| ≫ std (f32, mean ~1e3: y 933 for 2.46)",
    lambda c: c.training,
    Signature(_STATISTICS_DERIVED),
)

KERAS_MOMENTS_SECOND_ORDER = KnownIssue(
    "keras-moments-second-order",
    "Keras' normalization layers on TensorFlow take their statistics from tf.nn.moments, whose variance is "
    "mean((x − stop_gradient(μ))²): the first derivatives are right (∂σ²/∂μ = 0 at μ) but the second ones miss "
    "the mean's dependence on x, so a double backward is wrong (GroupNorm f32 d2x 1262.8 for 4010.8), and so is "
    "forward-over-reverse, the same second derivatives (LayerNorm 7x17 f64: jvp_dx −0.0766 for −0.1031)",
    lambda c: c.backward_differentiated and c.training,
    Signature(SECOND_DERIVATIVES),
)

KERAS_GN_HALF_SECOND_ORDER = KnownIssue(
    "keras-gn-half-second-order",
    "keras.layers.GroupNormalization with f16 input (f32 parameters too): its double backward overflows in half "
    "precision where the exact second derivative is within f16's range and a textbook GroupNorm through the same "
    "adapter passes (2x64x1x7, G = 64, values ~1e-3: d2x −inf for −61902)",
    lambda c: c.backward_differentiated and c.dtype == "f16",
    Signature(SECOND_DERIVATIVES, nonfinite=True),
)

TF_OUTER_AXIS_SUMS = KnownIssue(
    "tf-cpu-outer-axis-sums",
    "TensorFlow's CPU reduce_sum / reduce_mean over leading axes (BatchNorm's per-channel statistics: axes N, H, W) "
    "accumulates float32 in sequence: the error grows like M·u, not √M·u (65536 values of mean 7.0e3: the mean "
    "off by 8.0e3 u, where jax and torch are within 1 u); every output drawn from those sums follows (running_mean "
    "16 budgets, dβ 2). Reducing the innermost axes is accurate. Any TensorFlow code reduces this way",
    lambda c: c.dtype != "f64" and c.view.set_size >= 8192,
    Signature(("y", "dx", "dweight", "dbias", "running_mean", "running_var", "d2x", "d2weight", "d2dy"), max_ratio=1e3),
    code=("tensorflow",),
)

KERAS_FOLDED_BACKWARD = KnownIssue(
    "keras-bn-folded-backward",
    "keras.layers.BatchNormalization normalises with tf.nn.batch_normalization, x·r + (β − μ·r) for r = γ/√(σ² + ε): "
    "differentiated as written, dx is a difference of terms of size |μ|·|∂r/∂x| that cancel when |mean| ≫ std "
    "(f32, mean 7e3: dx −189 for −0.009, where a two-pass textbook through the same adapter is within budget)",
    lambda c: c.training and c.profile in ("offset", "near_constant"),
    Signature(("dx", "d2x", "d2weight", "d2dy", "jvp_y", "jvp_dx", "jvp_dweight")),
)

KERAS = (
    _array_impl("keras", "batchnorm", "keras.layers.BatchNormalization (Keras 3, TensorFlow backend, eager; gradients "
                "by tf.GradientTape)", f"{_KERAS}:batch_norm", "tf",
                known_issues=(KERAS_BIASED_RUNNING_VAR, KERAS_MOMENTS_SECOND_ORDER, TF_OUTER_AXIS_SUMS, KERAS_FOLDED_BACKWARD)),
    _array_impl("keras", "groupnorm", "keras.layers.GroupNormalization (TensorFlow backend)", f"{_KERAS}:group_norm",
                "tf", known_issues=(KERAS_MOMENTS_SECOND_ORDER, KERAS_GN_HALF_SECOND_ORDER)),
    _array_impl("keras", "layernorm", "keras.layers.LayerNormalization over the last K axes (TensorFlow backend)",
                f"{_KERAS}:layer_norm", "tf", follows=LN_TORCHS, known_issues=(KERAS_MOMENTS_SECOND_ORDER,)),
    _array_impl("keras", "syncbn", "keras.layers.BatchNormalization(synchronized=True) under "
                "tf.distribute.MirroredStrategy over logical CPU devices, uneven replica batches",
                f"{_KERAS}:sync_batch_norm", "tf", world="tf-devices", worlds=("tf-devices",),
                known_issues=(KERAS_BIASED_RUNNING_VAR, KERAS_SYNC_FAST_VARIANCE, TF_OUTER_AXIS_SUMS, KERAS_FOLDED_BACKWARD)),
)

_COMPILED = "normcheck.impls.compiled"

# ----------------------------------------------------------------------------- torch.compile's (torch 2.13, Inductor)
INDUCTOR_HALF_BACKWARD = KnownIssue(
    "inductor-half-backward",
    "torch.compile's backward (AOTAutograd + Inductor's C++ code) of batch_norm, group_norm, layer_norm (also inside "
    "the add + LayerNorm and adaLN composites) and instance_norm with "
    "f16/bf16 input gives dγ (and on near-constant sets dx) the input's precision, not float32's, also with f32 "
    "parameters: as if x̂ or the products were rounded to the input dtype before the sums (LayerNorm 1x3x8193 "
    "bf16/f32: dγ 90 budgets with 3 rows summed; GroupNorm bf16/f32 channels-last offset: dγ 40992 for −125052; "
    "f16 BatchNorm dγ inf for 919.2). For layer_norm the cause is the decomposition: on the CPU "
    "torch._refs.native_layer_norm saves mean and rstd rounded to the input dtype, and the backward recomputes x̂ from "
    "them (the compiled dγ is Σ dŷ·(x − q(μ))·q(rstd) to 1e-6). In the adaLN composite it shows only where x is "
    "frozen (with x differentiated the compiled backward keeps x̂ in float32): 2x3x1025 bf16/f32, dγ 78 budgets. "
    "Eager torch's kernels pass these cases or have issues of their own; rms_norm passes its whole sweep",
    lambda c: c.dtype in _HALF,
    Signature(("dx", "dresidual", "dweight", "dbias"), nonfinite=True),  # (add + norm's dresidual: its dx)
)

# The same issue where the adaLN composite has it: only dγ (dβ = Σ dŷ takes no x̂) and only with x frozen
INDUCTOR_HALF_BACKWARD_IN_ADALN = replace(INDUCTOR_HALF_BACKWARD, applies=lambda c: c.dtype in _HALF and c.frozen == "x",
                                          signature=Signature(("dweight",)))

# op -> the function compiled, and the known issues of its compiled code. The issues of torch's kernels do not follow
# it: Inductor generates its own code (its records name no aten op).
_FUNCTIONS = {"batchnorm": ("batch_norm", (INDUCTOR_HALF_BACKWARD,)), "groupnorm": ("group_norm", (INDUCTOR_HALF_BACKWARD,)),
              "layernorm": ("layer_norm", (INDUCTOR_HALF_BACKWARD,)), "rmsnorm": ("rms_norm", ()),
              "instancenorm": ("instance_norm", (INDUCTOR_HALF_BACKWARD,))}
# The fused ops have no F function: their eager composite (the op record's torch Impl) is what a user compiles
_COMPOSITES = {"add_rmsnorm": ("add_rms_norm", ()),
               "add_layernorm": ("add_layer_norm", (INDUCTOR_HALF_BACKWARD,)),  # (F.layer_norm's compiled backward)
               "groupnorm_silu": ("group_norm_silu", ()),
               "adaln": ("modulate", (INDUCTOR_HALF_BACKWARD_IN_ADALN,))}


def _compiled(op: str, fn: str, what: str, issues: tuple[KnownIssue, ...]) -> Impl:
    return Impl("torch-compile", op, f"torch.compile({what}, dynamic=True): Inductor's C++ code for forward and "
                "backward (AOTAutograd: once differentiable)", f"{_COMPILED}:{fn}", orders=(1,), dispatch_mode=False,
                follows=next(i for i in OPS[op].impls if i.name == "torch").follows,  # (torch's conventions)
                known_issues=issues)


COMPILED = tuple(_compiled(op, fn, f"F.{fn}", issues) for op, (fn, issues) in _FUNCTIONS.items()) + tuple(
    _compiled(op, fn, f"torch's composite {fn}", issues) for op, (fn, issues) in _COMPOSITES.items())

IMPLS = FLAX + KERAS + COMPILED
