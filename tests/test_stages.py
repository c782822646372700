"""Fused ops composed from stages (reference.stages, ops.fused, engine.stage_bounds): where a stage may sit, and a
fusion of two stages that no record declares, composed end to end (reference, bounds, verdicts) with no engine code
of its own."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normcheck import OPS, Case, compare, resolve_impl
from normcheck.engine import FAIL, PASS
from normcheck.ops import Operand, rmsnorm
from normcheck.ops.fused import fused
from normcheck.ops.gated_rmsnorm import gate_values
from normcheck.ops.layernorm import normalized_shape
from normcheck.ops.residual import RESIDUAL_ADD
from normcheck.reference.stages import AFTER, BEFORE, ONE_PLUS, SILU, Activation, Scale

GATE_IN, GATE_OUT = (Scale(name, SILU, (f"d{name}",), side=side) for name, side in (("gate", BEFORE), ("out_gate", AFTER)))
OPERANDS = tuple(Operand(name, draw=gate_values, gradient=f"d{name}") for name in ("gate", "out_gate"))


def _call(fn, t, case, group=None, world_size=1):
    return fn(t.x, t.extra["gate"], t.extra["out_gate"], normalized_shape(case), t.weight, case.eps)


def doubly_gated(x, gate, out_gate, normalized_shape, weight=None, eps=None):
    """RMSNorm(x·silu(gate))·w·silu(out_gate) in float32 at least, through autograd."""
    acc = torch.promote_types(x.dtype, torch.float32)
    w = None if weight is None else weight.to(acc)
    y = F.rms_norm(x.to(acc) * F.silu(gate.to(acc)), normalized_shape, w, eps) * F.silu(out_gate.to(acc))
    return y.to(x.dtype)


class _GateForgottenInBackward(torch.autograd.Function):
    """n·g whose backward hands the norm dy instead of dy·g (g's own gradient is right)."""

    @staticmethod
    def forward(ctx, n, g):
        ctx.save_for_backward(n)
        return n * g

    @staticmethod
    def backward(ctx, dy):
        n, = ctx.saved_tensors
        return dy, dy * n


def out_gate_forgotten_in_backward(x, gate, out_gate, normalized_shape, weight=None, eps=None):
    acc = torch.promote_types(x.dtype, torch.float32)
    w = None if weight is None else weight.to(acc)
    n = F.rms_norm(x.to(acc) * F.silu(gate.to(acc)), normalized_shape, w, eps)
    return _GateForgottenInBackward.apply(n, F.silu(out_gate.to(acc))).to(x.dtype)


@pytest.fixture
def doubly_gated_op(monkeypatch):
    """A record no module declares: RMSNorm with a SiLU gate on each side, registered for the test."""
    op = fused(rmsnorm.OP, (GATE_IN, GATE_OUT), name="doubly_gated_rmsnorm", description="test: two gates",
               signature="fn(x, gate, out_gate, normalized_shape, weight, eps)", call=_call,
               outputs=("y", "rstd", "dx", "dgate", "dout_gate", "dweight"),
               required=("y", "dx", "dgate", "dout_gate", "dweight"), operands=OPERANDS,
               fields=rmsnorm.OP.fields_without_extensions(), extensions=(), double_backward=False, impls=(),
               array_signature=None, array_call=None)
    monkeypatch.setitem(OPS, op.name, op)
    return op


def test_a_sum_sits_next_to_the_norm_and_an_activation_may_follow_a_modulation():
    record = dict(name="x", impls=(), outputs=("y", "rstd", "dx", "dgate", "dout_gate", "dresidual", "dweight"))
    gated = fused(rmsnorm.OP, (GATE_OUT, Activation(SILU)), operands=OPERANDS, **record)
    assert [s.kind for s in gated.stages] == ["scale", "activation"]
    with pytest.raises(ValueError, match="sum stage is bounded next to the norm only"):
        fused(rmsnorm.OP, (RESIDUAL_ADD, GATE_IN), operands=OPERANDS + (Operand("residual", gradient="dresidual"),),
              **record)
    with pytest.raises(ValueError, match="read operands it does not declare: shift"):
        fused(rmsnorm.OP, (Scale("gate", ONE_PLUS, ("dgate", "dshift"), shift="shift"),), operands=OPERANDS, **record)


def test_two_stages_compose_into_the_float64_derivatives(doubly_gated_op):
    case = Case(doubly_gated_op.name, (3, 11), "f64")
    i = case.make_inputs()
    out = doubly_gated_op.reference(i)
    leaves = [torch.tensor(a, requires_grad=True) for a in (i.x, i.extra["gate"], i.extra["out_gate"], i.weight)]
    y = doubly_gated(leaves[0], leaves[1], leaves[2], (11,), leaves[3], case.eps)
    y.backward(torch.tensor(i.dy))
    for name, theirs in zip(("y", "dx", "dgate", "dout_gate", "dweight"), (y,) + tuple(t.grad for t in leaves)):
        assert np.abs(out[name] - theirs.detach().numpy()).max() <= 1e-12 * np.abs(out[name]).max(), name


@pytest.mark.parametrize("dtype, param", [("f32", "f32"), ("bf16", "f32"), ("f16", "f16")])
def test_two_stages_judge_a_correct_kernel_and_a_wrong_one(doubly_gated_op, dtype, param):
    case = Case(doubly_gated_op.name, (4, 5, 24), dtype, param, profile="heavy_tailed")
    here = dict(backend="in-process", hints=False)  # (the record is this process's only)
    right = compare(doubly_gated_op.name, resolve_impl(doubly_gated_op.name, doubly_gated, **here), case)
    assert right.verdict == PASS or right.verdict != FAIL and dtype == "bf16"  # (bf16: MISTRUSTED may say why)
    wrong = compare(doubly_gated_op.name, resolve_impl(doubly_gated_op.name, out_gate_forgotten_in_backward, **here),
                    case)
    assert wrong.verdict == FAIL and wrong.worst.name in ("dx", "dgate", "dweight")
