"""The same-precision baseline: the straightforward way to write BN/GN in torch.

Inputs are upcast to the accumulation precision (float32, or float64 for float64), the textbook
two-pass forward and closed-form backward run there, and outputs are rounded to their storage
dtypes. The tolerance never demands much more accuracy than this honest implementation reaches.
"""
from __future__ import annotations

import torch

from .cases import Case, TorchInputs
from .dtypes import TORCH_DTYPES


def run_baseline(case: Case, t: TorchInputs) -> dict[str, torch.Tensor | None]:
    view = case.view
    acc = TORCH_DTYPES[case.dtypes.accumulation]
    axes = view.axes
    x = view.group(t.x.to(acc).contiguous())
    dy = view.group(t.dy.to(acc).contiguous())
    ones = torch.ones(case.channels, dtype=acc)
    gamma = view.per_channel(t.weight.to(acc) if t.weight is not None else ones)
    beta = view.per_channel(t.bias.to(acc) if t.bias is not None else 0 * ones)

    mu = x.mean(dim=axes, keepdim=True)
    dev = x - mu
    var = (dev * dev).mean(dim=axes, keepdim=True)
    r = torch.rsqrt(var + case.eps)
    xhat = dev * r
    y = gamma * xhat + beta
    if case.op == "syncbn_silu":  # the fused epilogue: z = SiLU(y), and dz reaches BN as dz·silu'(y)
        s = torch.sigmoid(y)
        dy = dy * s * (1 + y * (1 - s))
        y = y * s
    g = gamma * dy
    dx = r * (g - g.mean(dim=axes, keepdim=True) - xhat * (g * xhat).mean(dim=axes, keepdim=True))

    out_dtype, param_dtype = t.x.dtype, TORCH_DTYPES[case.param_dtype]
    stats_shape = (case.channels,) if case.groups is None else (case.shape[0], case.groups)
    out = {
        "y": view.ungroup(y).to(out_dtype),
        "dx": view.ungroup(dx).to(out_dtype),
        "dweight": view.channel_sum(dy * xhat).to(param_dtype) if t.weight is not None else None,
        "dbias": view.channel_sum(dy).to(param_dtype) if t.bias is not None else None,
        "mean": mu.reshape(stats_shape),
        ("invstd" if case.groups is None else "rstd"): r.reshape(stats_shape),
    }
    if case.groups is None:
        m, size = case.momentum, view.set_size
        unbiased = var.reshape(-1) * size / (size - 1)
        out["running_mean"] = ((1 - m) * t.running_mean.to(acc) + m * mu.reshape(-1)).to(param_dtype)
        out["running_var"] = ((1 - m) * t.running_var.to(acc) + m * unbiased).to(param_dtype)
    return out
