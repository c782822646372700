"""Adaptive (modulated) LayerNorm, a diffusion transformer's adaLN: y = LayerNorm(x)·(1 + scale) + shift, with
scale and shift one vector per sample (N, *normalized_shape), broadcast over its sequence: a Scale stage after the
norm (normcheck.reference.stages has the math: dŷ = dy·(1 + scale), dscale = Σ_S dy·ŷ, dshift = Σ_S dy per sample).
LayerNorm's rows, hidden sizes and eps; the LayerNorm's own γ, β optional (DiT's has none)."""
from __future__ import annotations

import numpy as np

from ..core.errors import UsageError
from ..reference.stages import ONE_PLUS, PER_SAMPLE, Scale
from . import layernorm
from .core import Impl, Operand
from .design import BATCH_SCAN, Design, Exclusion, Factor, at_most, eps_factor, levels, spread
from .fused import fused
from .layernorm import HIDDEN, MAX_ELEMENTS, normalized_axes, normalized_shape

SIGNATURE = ("fn(input, scale, shift, normalized_shape, weight, bias, eps) -> Tensor  (layer_norm(input)·(1 + scale) "
             "+ shift; scale and shift shaped (N, *normalized_shape), broadcast over the dims between)")
WHY_ONCE = ("the double backward and forward mode of a modulated LayerNorm are not judged yet: the directional-derivative formulas "
            "(reference.setwise) are a norm's of its own inputs, not of a modulation's")


# What modulated-norm kernels dispatch on beyond LayerNorm's hidden size: the samples (which vector a row takes:
# row // L) and the sequence each vector is broadcast over and dscale/dshift are summed over.
BATCH = Factor("batch", levels(
    1, "one sample: a modulation summed over the batch looks right",
    2, "two samples",
    5, "an odd number of samples",
), read=lambda c: c.shape[0], usual=1, scan=BATCH_SCAN)
SEQUENCE = Factor("sequence", levels(
    1, "one token per sample (a 2-D input, or a decode step): dscale = dy·ŷ, no sum",
    2, "two tokens",
    7, "a prime length: rows of one sample do not align with blocks",
    257, "one past 256 tokens: the sequence sum over blocks",
    4097, "one past 4096 tokens (DiT's 64x64 latent): a long sequence sum",
), read=lambda c: c.numel // max(c.shape[0] * c.view.set_size, 1), usual=2)


def modulated_shape(v: dict) -> dict:
    """(N, *S, H): the sequence over the dims between the batch and the last (none for a 2-D input)."""
    sequence = spread(v["sequence"], v["rank"] - 2) if v["rank"] > 2 else ()
    return {"shape": (v["batch"],) + sequence + (v["hidden"],), "normalized_dims": 1}


SWEEP = Design(
    factors=(BATCH, SEQUENCE, HIDDEN, eps_factor(0.0, 1e-10, 1e-5, 1e-2)),
    shape=modulated_shape,
    exclusions=(
        Exclusion(("rank", "sequence"), lambda rank, seq: rank > 2 or seq == 1, "a 2-D (N, H) input has no sequence"),
        at_most(MAX_ELEMENTS // 5, "sequence", "hidden", "a case of over 1.2M elements takes seconds"),
        Exclusion(("eps", "hidden"), lambda eps, h: eps != 0 or h > 2, "eps = 0 with rows of 1 or 2 values: "
                  "zero variance (two values can round equal)"),
    ),
)


def per_sample(case) -> tuple[int, ...]:
    """The modulation's shape: one vector over the normalised dims per sample."""
    return (case.shape[0],) + normalized_shape(case)


def modulation_values(rng, shape) -> np.ndarray:
    """Scale and shift as a conditioning MLP gives them: a few tenths, both signs (1 + scale stays away from 0)."""
    return rng.normal(0.0, 0.5, size=shape)


def validate(case) -> None:
    layernorm.validate(case)
    if layernorm.channels_first(case) or case.normalized_dims >= len(case.shape):
        raise UsageError(f"adaln modulates each sample over trailing normalised dims: K < {len(case.shape)} trailing "
                         f"dims (--normalized-dims {case.normalized_dims}, --normalized-at {case.normalized_at})")


def call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["scale"], t.extra["shift"], normalized_shape(case), t.weight, t.bias, case.eps)


ARRAY_SIGNATURE = ("fn(x, scale, shift, weight, bias, *, axes, eps) -> y  (axes: the normalised ones, (-K, ..., -1); "
                   "scale and shift shaped (N, *normalized_shape))")


def array_call(fn, a, case):
    return fn(a.x, a.extra["scale"], a.extra["shift"], a.weight, a.bias, axes=normalized_axes(case), eps=case.eps)


def over_sequence(a, ndim: int):
    """A per-sample (N, *D) tensor as (N, 1, ..., 1, *D) against an input of `ndim` dims."""
    return a.reshape(a.shape[:1] + (1,) * (ndim - a.dim()) + a.shape[1:])


def modulate(input, scale, shift, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The eager composite, as DiT writes it: F.layer_norm, then · (1 + scale) + shift broadcast over the sequence."""
    import torch.nn.functional as F
    y = F.layer_norm(input, normalized_shape, weight, bias, eps)
    return y * (1 + over_sequence(scale, input.dim())) + over_sequence(shift, input.dim())


OPERANDS = (Operand("scale", shape=per_sample, draw=modulation_values, gradient="dscale"),
            Operand("shift", shape=per_sample, draw=modulation_values, gradient="dshift"))

# y = ŷ·(1 + scale) + shift, one vector per sample broadcast over its sequence
MODULATION = Scale("scale", ONE_PLUS, ("dscale", "dshift"), shift="shift", broadcast=PER_SAMPLE)

OP = fused(
    layernorm.OP, (MODULATION,), name="adaln", description="adaptive LayerNorm: LayerNorm(x)·(1 + scale) + shift, "
    "scale and shift per sample", signature=SIGNATURE, call=call, validate=validate,
    outputs=("y", "dx", "dscale", "dshift", "dweight", "dbias"), required=("y", "dx", "dscale", "dshift", "dweight", "dbias"),
    saved_stats=(), sweep=SWEEP, operands=OPERANDS, fields=layernorm.OP.fields_without_extensions(), extensions=(),
    double_backward=False, why_once_differentiable=WHY_ONCE, array_signature=ARRAY_SIGNATURE, array_call=array_call,
    impls=(Impl("torch", "adaln", "F.layer_norm · (1 + scale) + shift, through autograd", modulate,
                known_issues=layernorm.TORCH_ISSUES, follows=layernorm.TORCHS),),
)
