"""Implementations that call torch's kernels and add a bug of their own: a known issue of those kernels must not
excuse them (tests/test_known_issues.py). Importable by name, so they run in the isolated worker as users' code does."""
import torch
import torch.nn.functional as F


def detached_input(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """torch's batch_norm of a detached x: dx is identically zero."""
    return F.batch_norm(input.detach(), running_mean, running_var, weight, bias, training, momentum, eps) + 0 * input


class _LeakDy(torch.autograd.Function):
    """Adds nothing to y, and 0.02·dy to dx."""

    @staticmethod
    def forward(ctx, x):
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx, dy):
        return 0.02 * dy


def f16_dx_plus_dy(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """torch's batch_norm, with 0.02·dy added to dx for f16 input."""
    y = F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    return y + _LeakDy.apply(input) if input.dtype == torch.float16 else y


def prints_while_it_runs(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """torch's batch_norm, printing as debugging code does."""
    print("debug: in my batch_norm", input.shape)
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
