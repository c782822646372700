"""What a correct implementation returns for a case: the float64 reference of every output the case asks for.

The op's record gives the training-mode forward and first-order backward; eval mode (running statistics in
place of the batch's) and the directional derivatives (order 2's second-order outputs, forward mode's JVPs) are the
same for every op, written once over the grouped view (reference.setwise). Only the gradients the case asks for are
expected (Case.grads: none for a frozen input, none at order fwd).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cases import Case, CaseInputs
from ..numerics.dtypes import ROUNDS_XHAT, weight_sees
from ..ops.core import DIRECTIONAL, X_SHAPED
from ..ops.fused import reference_of
from ..reference.setwise import Arithmetic, eval_mode, numpy_arithmetic, second_order


@dataclass(frozen=True)
class Grouped:
    """A case's inputs in its grouped view (N, K, L, S), γ and β as the layer applies them, in one dtype."""
    x: np.ndarray
    dy: np.ndarray
    gamma: np.ndarray
    beta: np.ndarray
    running: tuple[np.ndarray, np.ndarray] | None  # eval mode: (μ, σ²), the running statistics broadcast per set
    ddx: np.ndarray        # the directions: order 2's cotangents, forward mode's tangents (zeros where none)
    ddweight: np.ndarray
    ddbias: np.ndarray


def effective_affine(case: Case, inputs: CaseInputs, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """γ and β as the layer applies them in `dtype`, broadcastable against the grouped view: a present weight
    with its offset added (RMSNorm's w + offset), absent ones 1 and 0. The weight is taken into `dtype` before the
    offset is added there, as the op's reference forms it in its working precision: a float32 kernel adds 1 to a
    float64 w rounded to float32, which moves w + 1 by up to u·|w| however small w + 1 is (Gemma's w ≈ −1), and the
    baseline of the directional derivatives rounds it so as the baseline of y does."""
    view = case.view
    ones = np.ones(view.param_shape, dtype)
    gamma = ones if inputs.weight is None else inputs.weight.astype(dtype) + dtype(case.weight_offset or 0.0)
    beta = inputs.bias.astype(dtype) if inputs.bias is not None else 0 * ones
    return view.per_channel_values(gamma), view.per_channel_values(beta)


def grouped(case: Case, inputs: CaseInputs, dtype=np.float64) -> Grouped:
    view = case.view
    zeros = np.zeros(view.param_shape)

    def param(a):
        return view.per_channel_values(zeros if a is None else a).astype(dtype)

    running = None
    if not case.training:
        running = (param(inputs.running_mean), param(inputs.running_var))
    gamma, beta = effective_affine(case, inputs, dtype)
    return Grouped(
        x=view.group(inputs.x).astype(dtype), dy=view.group(inputs.dy).astype(dtype),
        gamma=gamma.astype(dtype), beta=beta.astype(dtype), running=running,
        ddx=view.group(np.zeros(case.shape) if inputs.ddx is None else inputs.ddx).astype(dtype),
        ddweight=param(inputs.ddweight), ddbias=param(inputs.ddbias),
    )


def arithmetic(case: Case) -> Arithmetic:
    """NumPy reductions over the case's sets and its parameters' elements."""
    return numpy_arithmetic(case.view)


def expected_outputs(case: Case, inputs: CaseInputs) -> dict[str, np.ndarray]:
    op, view = case.record, case.view
    g = grouped(case, inputs) if not case.training or case.order != 1 else None  # (the op's own reference: none)
    if case.training:
        ref = reference_of(case)(inputs)
    else:
        ref = eval_mode(g.x, g.dy, g.gamma, g.beta, *g.running, case.eps_value, arithmetic(case), op.epilogue)
        ref = {"y": view.ungroup(ref["y"]), "dx": view.ungroup(ref["dx"]), "dweight": ref["dweight"],
               "dbias": ref["dbias"], "running_mean": inputs.running_mean, "running_var": inputs.running_var}
    ref = {k: v for k, v in ref.items() if k not in op.gradients or k in case.grads}
    if case.order != 1:
        out = directional_outputs(case, g, arithmetic(case))
        ref.update({name: as_output(case, name, a) for name, a in out.items()})
    return ref


def directional_outputs(case: Case, g: Grouped, ar: Arithmetic, rounds: bool = True) -> dict:
    """The case's directional derivatives (Case.directional) from grouped inputs under `ar` (grouped, or per
    parameter: as_output), each from the setwise formula that gives it (ops.DIRECTIONAL); the x̂ the weight sees
    rounded as the case's casting chain rounds it (numerics.dtypes.weight_sees), as the first-order reference has it
    (`rounds` False: x̂ itself, for values that are not arrays: the running error's, whose bound adds the chain's
    flips instead)."""
    chain = case.casting if rounds and case.casting in ROUNDS_XHAT else None
    out = second_order(g.x, g.dy, g.gamma, g.ddx, g.ddweight, g.ddbias, case.eps_value, ar,
                       centred=case.record.centred, stats=g.running,
                       wanted={DIRECTIONAL[name] for name in case.directional},
                       seen=None if chain is None else lambda xhat, x, r: weight_sees(xhat, chain, case.dtype, x, r))
    return {name: out[DIRECTIONAL[name]] for name in case.directional}


def as_output(case: Case, name: str, a: np.ndarray) -> np.ndarray:
    """A grouped (or broadcast) array in the output's own shape: x's for those shaped like x, the parameter's else."""
    view = case.view
    if name in X_SHAPED:
        return view.ungroup(np.broadcast_to(a, view.grouped_shape))
    return np.broadcast_to(a, view.param_shape)
