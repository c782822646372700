"""The same-precision baseline: the straightforward way to write the op, in NumPy.

Inputs are upcast to the accumulation precision (float32, or float64 for float64 unless the kernel computes in
float32 at most), the textbook
two-pass forward and closed-form backward run there, and outputs are rounded to their storage
dtypes. The tolerance never demands much more accuracy than this honest implementation reaches.
"""
from __future__ import annotations

import numpy as np

from ..cases import Case, CaseInputs
from ..numerics.dtypes import quantise, weight_sees
from ..reference.setwise import eval_mode
from .expected import Grouped, arithmetic, as_output, effective_affine, grouped, second_order_outputs

_NUMPY = {"f64": np.float64, "f32": np.float32}


def baseline_outputs(case: Case, inputs: CaseInputs) -> dict[str, np.ndarray | None]:
    # (the grouped inputs in the accumulation precision, for eval mode and the second-order formulas)
    g = grouped(case, inputs, _NUMPY[case.dtypes.accumulation]) if not case.training or case.order == 2 else None
    out = first_order(case, inputs) if case.training else eval_outputs(case, inputs, g)
    if case.order == 2:  # the second-order formulas in the accumulation precision
        second = second_order_outputs(case, g, arithmetic(case))
        out.update({name: quantise(as_output(case, name, a), case.record.output_dtype(case, name))
                    for name, a in second.items()})
    return out


def eval_outputs(case: Case, inputs: CaseInputs, g: Grouped) -> dict[str, np.ndarray | None]:
    """Eval mode: normalised with the running statistics, which stay as they were."""
    op, view = case.record, case.view
    out = eval_mode(g.x, g.dy, g.gamma, g.beta, *g.running, case.eps_value, arithmetic(case), op.epilogue)
    return {"y": quantise(view.ungroup(out["y"]), op.output_dtype(case, "y")), "dx": quantise(view.ungroup(out["dx"]), case.dtype),
            "dweight": quantise(out["dweight"], case.param_dtype) if inputs.weight is not None else None,
            "dbias": quantise(out["dbias"], case.param_dtype) if inputs.bias is not None else None,
            "running_mean": inputs.running_mean, "running_var": inputs.running_var}


def first_order(case: Case, inputs: CaseInputs) -> dict[str, np.ndarray | None]:
    """Training mode: the textbook two-pass forward and closed-form backward."""
    op, view = case.record, case.view
    acc = _NUMPY[case.dtypes.accumulation]
    axes = view.axes
    x = view.group(inputs.x.astype(acc))
    dy = view.group(inputs.dy.astype(acc))
    gamma, beta = (a.astype(acc) for a in effective_affine(case, inputs))

    mu = x.mean(axis=axes, keepdims=True) if op.centred else np.zeros_like(x.mean(axis=axes, keepdims=True))
    dev = x - mu
    var = (dev * dev).mean(axis=axes, keepdims=True)
    r = 1 / np.sqrt(var + case.eps_value)  # Python scalars round to the array's dtype, as in torch
    xhat = dev * r
    scaled = weight_sees(xhat, case.casting, case.dtype, x, r).astype(acc)
    y = gamma * scaled + beta
    if op.epilogue is not None:  # a fused epilogue: z = f(y), and dz reaches the norm as dz·f'(y)
        dy = dy * op.epilogue.grad(y)
        y = op.epilogue.f(y)
    g = gamma * dy
    gbar = g.mean(axis=axes, keepdims=True) if op.centred else 0
    dx = r * (g - gbar - xhat * (g * xhat).mean(axis=axes, keepdims=True))

    out = {
        "y": quantise(view.ungroup(y), op.output_dtype(case, "y")),
        "dx": quantise(view.ungroup(dx), case.dtype),
        "dweight": quantise(view.channel_sum(dy * scaled), case.param_dtype) if inputs.weight is not None else None,
        "dbias": quantise(view.channel_sum(dy), case.param_dtype) if inputs.bias is not None else None,
    }
    stats = {"mean": mu, "invstd": r, "rstd": r}
    for name in op.saved_stats:  # in the accumulation precision
        out[name] = stats[name].reshape(view.stats_shape).astype(np.float64)
    if op.running_stats:
        m, size = case.momentum, view.set_size
        # per channel: the set's statistic (BatchNorm) or the batch average of the instances' (InstanceNorm)
        unbiased = (var * size / (size - 1)).mean(axis=0).reshape(-1)
        out["running_mean"] = quantise((1 - m) * inputs.running_mean.astype(acc) + m * mu.mean(axis=0).reshape(-1),
                                       case.param_dtype)
        out["running_var"] = quantise((1 - m) * inputs.running_var.astype(acc) + m * unbiased, case.param_dtype)
    return out
