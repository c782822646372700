"""The same-precision baseline: the op's own math, evaluated in the precision an honest kernel computes in.

The op's float64 reference (training mode) and the setwise formulas every op shares (eval mode, order 2) run in
the accumulation precision (float32, or float64 for float64 unless the kernel computes in float32 at most) and
their outputs are rounded to their storage dtypes. There is no second model of any op to fall out of step with
its reference. The tolerance never demands much more accuracy than this honest implementation reaches.
"""
from __future__ import annotations

import numpy as np

from ..cases import Case, CaseInputs
from ..numerics.dtypes import quantise
from ..ops.fused import reference_of
from ..reference import working_precision
from ..reference.setwise import eval_mode
from .expected import Grouped, arithmetic, as_output, directional_outputs, grouped

_NUMPY = {"f64": np.float64, "f32": np.float32}


def baseline_outputs(case: Case, inputs: CaseInputs, reference: dict | None = None) -> dict[str, np.ndarray | None]:
    """Every output the op defines, in the case's accumulation precision. `reference`, the case's float64 reference
    when at hand: in float64 accumulation the baseline's arithmetic is the reference's own, so it is that reference
    stored in each output's dtype, not evaluated again."""
    if reference is not None and case.dtypes.accumulation == "f64":
        return {name: None if a is None else _stored(case, name, a) for name, a in reference.items()}
    # (the grouped inputs in the accumulation precision, for eval mode and the directional-derivative formulas)
    g = grouped(case, inputs, _NUMPY[case.dtypes.accumulation]) if not case.training or case.order != 1 else None
    out = first_order(case, inputs) if case.training else eval_outputs(case, inputs, g)
    if case.order != 1:  # the directional-derivative formulas in the accumulation precision
        second = directional_outputs(case, g, arithmetic(case))
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
    """Training mode: the op's own reference, evaluated in the accumulation precision, each output rounded to
    its storage dtype (saved statistics stay in the accumulation precision)."""
    with working_precision(_NUMPY[case.dtypes.accumulation]):
        out = reference_of(case)(inputs)
    return {name: _stored(case, name, a) for name, a in out.items()}


def _stored(case: Case, name: str, a: np.ndarray) -> np.ndarray:
    """An output as a kernel stores it: rounded to its dtype (saved statistics stay in the accumulation
    precision). One already in float64 and stored in float64 is returned as it is, not copied: the float64
    baseline's such outputs are then the reference's own arrays, which the allowance sees need no comparing."""
    op = case.record
    if name in op.saved_stats:
        return np.asarray(a, dtype=np.float64)
    dtype = case.param_dtype if name.startswith("running_") else op.output_dtype(case, name)
    return a if dtype == "f64" and isinstance(a, np.ndarray) and a.dtype == np.float64 else quantise(a, dtype)
