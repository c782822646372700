"""torch's own functional norms, and a LayerNorm Function with a backward of its own, for the tests that check
normcheck's references and paths against torch directly (tests/test_modes.py, tests/test_forward_mode.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def float64_tensors(inputs, names) -> dict:
    """The case's NumPy inputs `names` as float64 tensors of their own (None stays None)."""
    return {k: None if getattr(inputs, k) is None else torch.from_numpy(getattr(inputs, k).copy()) for k in names}


def functional_y(case, t: dict):
    """y of torch's functional op for `case` on the tensors `t` (x, weight, bias and the running statistics)."""
    if case.op in ("batchnorm", "instancenorm"):
        fn = F.batch_norm if case.op == "batchnorm" else F.instance_norm
        return fn(t["x"], t["running_mean"], t["running_var"], t["weight"], t["bias"], case.training, 0.1, case.eps)
    if case.op == "groupnorm":
        return F.group_norm(t["x"], case.groups, t["weight"], t["bias"], case.eps)
    if case.op == "layernorm":
        return F.layer_norm(t["x"], case.shape[-case.normalized_dims:], t["weight"], t["bias"], case.eps)
    return F.rms_norm(t["x"], case.shape[-case.normalized_dims:], t["weight"], case.eps)


def layer_norm_grads(ctx, dy):
    """(dx, dγ, dβ) of F.layer_norm at the saved (x, γ, β), through autograd on detached copies."""
    x, weight, bias = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [a.detach().requires_grad_() for a in (x, weight, bias)]
        y = F.layer_norm(leaves[0], x.shape[-1:], leaves[1], leaves[2], ctx.eps)
        return torch.autograd.grad(y, leaves, dy)


class SavedInputsLayerNorm(torch.autograd.Function):
    """A correct LayerNorm over the last dim: F.layer_norm forward, a backward of its own from the saved inputs
    (layer_norm_grads), and no forward-mode formula (no jvp)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ctx.save_for_backward(x, weight, bias)
        ctx.eps = eps
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def backward(ctx, dy):
        return (*layer_norm_grads(ctx, dy), None)
