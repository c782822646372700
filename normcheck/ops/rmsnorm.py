"""RMSNorm: y = x · rsqrt(mean(x²) + eps) · (w + offset) per row over the last k dims; no mean, no bias."""
from __future__ import annotations

import warnings

import numpy as np

from .. import reference
from ..core.errors import UsageError
from ..numerics.dtypes import CASTINGS, accumulation, weight_sees
from .batchnorm import drop_none
from . import fp8
from .core import AMONG_CHOICES, CaseField, Impl, KnownIssue, Op, Signature
from .design import Design, Factor, eps_factor, levels
from .layernorm import DIMS, HIDDEN, ROW_EXCLUSIONS, ROWS, as_given, as_trailing, normalized_axes, normalized_shape
from .layernorm import NORMALIZED_AT_FIELD, NORMALIZED_DIMS_FIELD, rows_shape, view
from .layernorm import validate as validate_dims

SIGNATURE = ("fn(input, normalized_shape, weight, eps) -> Tensor  (torch.nn.functional.rms_norm; eps may be None); "
             f"with --fp8: fn(..., eps, {fp8.KEYWORDS}) -> {fp8.RETURNS}")
OUTPUTS = ("y", "rstd", "dx", "dweight")
REQUIRED = ("y", "dx", "dweight")

# LayerNorm's rows and hidden sizes; eps=None (the dtype's default) and γ ≈ 0 (with an offset, w + offset
# rounds in a low-precision weight) besides.
SWEEP = Design(
    factors=(ROWS, HIDDEN, DIMS, eps_factor(None, 0.0, 1e-10, 1e-6, 1e-2),
             Factor("gamma_scale", levels(1.0, "γ of size 1", 1e-3, "γ ≈ 0: w + offset rounds in a low-precision weight"),
                    read=lambda c: c.gamma_scale, fields=lambda v: {"gamma_scale": v})),
    shape=rows_shape, exclusions=ROW_EXCLUSIONS,
)


def default_eps(dtype: str) -> float:
    """What eps=None means: the machine epsilon of the precision the kernel computes in (float32 for
    f16/bf16/f32 input, as torch's kernels do since pytorch#142848; its docs said the input dtype's)."""
    return float(np.finfo(np.float64 if accumulation(dtype) == "f64" else np.float32).eps)


def validate(case) -> None:
    validate_dims(case)  # (LayerNorm's: fp8's too)
    if not np.isfinite(case.weight_offset):
        raise UsageError(f"the weight offset must be a finite number, got {case.weight_offset}")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, normalized_shape(case), t.weight, case.eps, **fp8.keywords(t, case))


ARRAY_SIGNATURE = ("fn(x, weight, *, axes, eps) -> y  (axes: the normalised ones, (-K, ..., -1); channels-first: "
                   "(1, ..., K); eps: a number)")


def array_call(fn, a, case):
    fp8.refuse_arrays(case)
    return fn(a.x, a.weight, axes=normalized_axes(case), eps=case.eps_value)


def convention_of(c) -> dict:
    return dict(eps=c.eps_value, offset=c.weight_offset, rounding=lambda a, x, r: weight_sees(a, c.casting, c.dtype, x, r))


def forward(i) -> np.ndarray:
    """The reference's y alone."""
    c = i.case
    return as_given(c, reference.rms_norm_forward(as_trailing(c, i.x), normalized_shape(c), i.weight, **convention_of(c)).y)


def reference_outputs(i) -> dict[str, np.ndarray]:
    c, d = i.case, normalized_shape(i.case)
    convention = convention_of(c)
    x, dy = as_trailing(c, i.x), as_trailing(c, i.dy)
    fwd = reference.rms_norm_forward(x, d, i.weight, **convention)
    bwd = reference.rms_norm_backward(dy, x, d, i.weight, **convention)
    y = as_given(c, fwd.y)
    return drop_none(y=y, rstd=as_given(c, fwd.rstd), dx=as_given(c, bwd.dx), dweight=bwd.dweight)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """F.rms_norm without its warning for f16/bf16 input with f32 weight (it then runs the composite ops)."""
    import torch.nn.functional as F
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.rms_norm(input, normalized_shape, weight, eps)


def fused_forward(case, t):
    """aten._fused_rms_norm (the CPU kernel F.rms_norm runs when no gradient is needed) for y and rstd;
    the gradients through F.rms_norm's autograd, as torch 2.13 has no CPU _fused_rms_norm_backward."""
    import torch
    d = list(normalized_shape(case))
    y, rstd = torch.ops.aten._fused_rms_norm(t.x, d, t.weight, case.eps)
    leaves = [a.requires_grad_() for a in (t.x, t.weight) if a is not None]
    grads = torch.autograd.grad(rms_norm(t.x, d, t.weight, case.eps), leaves, t.dy)
    return {"y": y, "rstd": rstd, "dx": grads[0], "dweight": grads[1] if t.weight is not None else None}


# torch's convention: the last K dims, w as given, rounded once at the end
TORCHS = {"normalized_at": "trailing", "weight_offset": 0.0, "casting": "end"}
# Found by --check batch-invariance (engine.invariance)
BATCH_VARIANCE = KnownIssue(
    "torch-rms-norm-batch-variance",
    "torch CPU F.rms_norm (a composite: x.pow(2).mean(-1), ..., and its autograd) orders its reductions by the whole "
    "tensor's shape and layout (TensorIterator), so a row's y and dx change by up to a few ulps with the batch it is "
    "in: seen on strided and transposed f32/f64 x or dy, on long contiguous f64 rows and in f16 dx (add + RMSNorm); "
    "aten._fused_rms_norm alike",
    lambda c: True,
    Signature(message=r"^not batch invariant"),
)
WEIGHT_OFFSET = CaseField("weight_offset", 0.0, "the implementation scales by w + F (1 for Gemma's zero-centred "
                          "weight; default 0)", parse=float, metavar="F", label="w+{:g}", quiet=0.0,
                          probes=(0.0, 1.0), meanings={0.0: "scales by w", 1.0: "scales by 1 + w"},
                          draw=lambda shape, op: (0.0, 1.0))
CASTING = CaseField("casting", "end", "where the implementation rounds to the input dtype: "
                    f"{' or '.join(CASTINGS)} (default end)", choices=CASTINGS, metavar="MODE", label="cast={}",
                    quiet="end", meanings={"end": "rounds to the input dtype once, at the end",
                                           "before-weight": "rounds x̂ to the input dtype before the weight",
                                           "rstd-input": "rounds rstd and x · rstd to the input dtype before the weight"},
                    draw=AMONG_CHOICES)


def rms_norm_fp8(input, normalized_shape, weight=None, eps=None, *, scale, fp8_dtype):
    """F.rms_norm, then y quantised in torch (fp8.quantised)."""
    return fp8.quantised(rms_norm(input, normalized_shape, weight, eps), scale, fp8_dtype)

OP = Op(
    name="rmsnorm",
    description="RMSNorm: x · rsqrt(mean(x²) + eps) · (w + offset) per row over the last K dims",
    signature=SIGNATURE, call=call, reference=reference_outputs, view=view, unit="layer",
    outputs=OUTPUTS, required=REQUIRED, saved_stats=("rstd",), sweep=SWEEP,
    fields=(NORMALIZED_DIMS_FIELD, NORMALIZED_AT_FIELD, WEIGHT_OFFSET, CASTING, fp8.FIELD), set_dim=-1, validate=validate,
    params=("weight",), centred=False, eps_none=default_eps, min_set_size=1,
    array_signature=ARRAY_SIGNATURE, array_call=array_call, channels=False,
    extensions=(fp8.extension(forward),),
    impls=(
        Impl("torch", "rmsnorm", "torch.nn.functional.rms_norm through autograd (composite ops on CPU)", rms_norm,
             follows={**TORCHS, "fp8": None}, known_issues=(BATCH_VARIANCE,)),
        Impl("torch-fused-forward", "rmsnorm",
             "aten._fused_rms_norm for y and rstd (the inference kernel); gradients through autograd",
             fused_forward, convention="direct", follows={**TORCHS, "fp8": None}, known_issues=(BATCH_VARIANCE,)),
        *(Impl(f"torch-fp8-{f}", "rmsnorm", f"torch.nn.functional.rms_norm through autograd, y quantised to "
               f"{fp8.TORCH_NAMES[f]} in torch", rms_norm_fp8, follows={**TORCHS, "fp8": f},
               known_issues=(BATCH_VARIANCE,)) for f in fp8.FP8_FORMATS),
    ),
)
