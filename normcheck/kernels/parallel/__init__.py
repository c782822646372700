"""Parallel norms: textbook sequence- and hidden-parallel LayerNorm and RMSNorm (the ops layernorm_sp, rmsnorm_sp,
layernorm_hp, rmsnorm_hp), written against normcheck.kernels.syncbn.collectives so they run in the lockstep and
gloo worlds."""
from __future__ import annotations

from ...ops import Impl

_HERE = "normcheck.kernels.parallel"
_WHAT = {"sequence": "its own rows normalised in float32, γ/β gradients all-reduced in backward (reduces_grads)",
         "add": "its rows of x + residual (the stream stays sharded), normalised in float32, γ/β gradients "
                "all-reduced in backward (reduces_grads)",
         "hidden": "Σ over every rank's slice all-reduced (LayerNorm: the mean, then Σ(x − mean)²), its slice "
                   "normalised in float32"}


def _textbook(op: str, module: str, attr: str) -> Impl:
    what = _WHAT["add" if attr.startswith("add_") else module]
    return Impl("textbook", op, f"textbook {op}: {what}", f"{_HERE}.{module}:{attr}", world="lockstep",
                capabilities="all dtypes and memory formats", modes=("train",), orders=(1,),
                follows={"weight_offset": 0.0, "casting": "end"} if attr.endswith("rms_norm") else {})


IMPLS = (
    _textbook("layernorm_sp", "sequence", "layer_norm"),
    _textbook("rmsnorm_sp", "sequence", "rms_norm"),
    _textbook("layernorm_hp", "hidden", "layer_norm"),
    _textbook("rmsnorm_hp", "hidden", "rms_norm"),
    _textbook("add_layernorm_sp", "sequence", "add_layer_norm"),
    _textbook("add_rmsnorm_sp", "sequence", "add_rms_norm"),
)
