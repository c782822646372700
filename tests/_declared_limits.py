"""Implementations that declare (or fail to declare) their limits, for tests/test_declared_limits.py; module-level,
so the isolated world's worker process and the gloo world's ranks import them too.

* RMSNorm as a torch.library custom op whose registered backward calls a second custom op with no autograd of its
  own (registered at import, namespace normcheck_tests): once differentiable, without a forward-mode formula;
* RMSNorm as an autograd.Function whose backward works from the saved x̂ and 1/rms (not differentiable through the
  statistics) with a correct jvp for its forward, and the same with its backward marked @once_differentiable;
* functions that decline cases by raising normcheck.Unsupported: RMSNorm for float32 only, and SyncBN (the syncbn
  contract) declining on every rank or on rank 1 alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

import normcheck
from normcheck.kernels.syncbn import collectives
from normcheck.kernels.syncbn.recipes.torch19 import sync_batch_norm

# -- a custom op without a double backward ------------------------------------------------------------------------


def _rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@torch.library.custom_op("normcheck_tests::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = _rstd(x, eps)
    return x * rstd * weight, rstd


@rms_norm_fwd.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1] + (1,))


@torch.library.custom_op("normcheck_tests::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x_hat, g = x * rstd, dy * weight
    dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    return dx, (dy * x_hat).reshape(-1, x.shape[-1]).sum(0)


@rms_norm_bwd.register_fake
def _(dy, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, dy, drstd):
    x, weight, rstd = ctx.saved_tensors
    return (*rms_norm_bwd(dy, x, weight, rstd), None)  # (rms_norm_bwd has no autograd: no double backward)


rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def custom_op_rms_norm(input, normalized_shape, weight=None, eps=None):
    """A correct RMSNorm over the last dim (with γ) as a custom op: once differentiable, no forward-mode formula."""
    return rms_norm_fwd(input, weight, torch.finfo(input.dtype).eps if eps is None else eps)[0]


# -- a backward from saved intermediates ----------------------------------------------------------------------------


class SavedStatsRMSNorm(torch.autograd.Function):
    """RMSNorm over the last dim (with γ): a correct forward with a correct jvp; a backward computed from the saved
    x̂ and 1/rms, right at order 1 but not differentiable through the statistics (not declared so)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = _rstd(x, eps)
        x_hat = x * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        ctx.save_for_forward(x, weight, rstd)
        return x_hat * weight

    @staticmethod
    def jvp(ctx, tx, tweight, _):
        x, weight, rstd = ctx.saved_tensors
        tx = torch.zeros_like(x) if tx is None else tx
        trstd = -rstd.pow(3) * (x * tx).mean(-1, keepdim=True)
        ty = (tx * rstd + x * trstd) * weight
        return ty if tweight is None else ty + x * rstd * tweight

    @staticmethod
    def backward(ctx, dy):
        x_hat, rstd, weight = ctx.saved_tensors
        g = dy * weight
        dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return dx, (dy * x_hat).reshape(-1, x_hat.shape[-1]).sum(0), None


class OnceSavedStatsRMSNorm(SavedStatsRMSNorm):
    """The same, declaring its backward once differentiable."""

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return SavedStatsRMSNorm.backward(ctx, dy)


def saved_stats_rms_norm(input, normalized_shape, weight=None, eps=None):
    return SavedStatsRMSNorm.apply(input, weight, torch.finfo(input.dtype).eps if eps is None else eps)


def once_saved_stats_rms_norm(input, normalized_shape, weight=None, eps=None):
    return OnceSavedStatsRMSNorm.apply(input, weight, torch.finfo(input.dtype).eps if eps is None else eps)


# -- declining cases ------------------------------------------------------------------------------------------------

WHY_F32_ONLY = "only a float32 kernel is built"


def f32_only_rms_norm(input, normalized_shape, weight=None, eps=None):
    """torch's RMSNorm for float32 input; declines any other dtype."""
    if input.dtype != torch.float32:
        raise normcheck.Unsupported(WHY_F32_ONLY)
    return F.rms_norm(input, normalized_shape, weight, eps)


WHY_NO_SPLIT = "this recipe runs on one rank only"


def declines_every_split(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """A SyncBN that declines every case on every rank (before any collective)."""
    raise normcheck.Unsupported(WHY_NO_SPLIT)


def declines_on_rank1(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size):
    """torch 1.9's SyncBN recipe, except that rank 1 declines the case while its peers run it."""
    if collectives.rank(group) == 1:
        raise normcheck.Unsupported(WHY_NO_SPLIT)
    return sync_batch_norm(x, weight, bias, running_mean, running_var, eps, momentum, group, world_size)
