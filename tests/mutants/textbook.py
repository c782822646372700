"""The textbook BatchNorm / GroupNorm / LayerNorm / InstanceNorm (explicit forward and backward, float32 accumulation
for half inputs) with switchable bugs: the machinery of their mutant catalogues (tests/mutants/
batchnorm.py, groupnorm.py, layernorm.py). One SetView says which elements form a set."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.numerics.sets import SetView

LANES = 16  # the vector width of the emulated low-precision kernel


@dataclass(frozen=True)
class Bugs:
    unbiased_normalise: bool = False        # normalise by the unbiased variance (M − 1)
    naive_variance: bool = False            # var = E[x²] − E[x]²
    low_precision_accumulation: bool = False  # sums accumulated in the f16/bf16 input dtype
    drop_xhat_term: bool = False            # dx forgets −x̂·mean(dy·x̂)
    biased_running_var: bool = False        # running_var updated with the biased variance
    ignore_strides: bool = False            # reads x and dy as if they were contiguous
    ignore_storage_offset: bool = False     # reads x and dy from the start of their storage
    gamma_outside_group_sums: bool = False  # GN: γ applied outside the group sums (BN formula)
    bf16_moments: bool = False              # mean and invstd rounded to bf16
    eps_outside_sqrt: bool = False          # invstd = 1 / (sqrt(var) + eps)
    momentum_swapped: bool = False          # running = m·running + (1 − m)·batch
    interleaved_groups: bool = False        # GN: channel c in group c % G instead of c // G
    modifies_input: bool = False            # centres x in place and leaves it that way
    per_sample_variance: bool = False       # BN: average of per-sample variances
    dweight_missing_invstd: bool = False    # dγ = Σ dy·(x − μ)
    low_precision_param_sums: bool = False  # dγ, dβ summed over the batch/rows in the f16/bf16 input dtype
    batch_statistics: bool = False          # IN: normalises with the channel's statistics over the batch (BN)
    running_var_pooled: bool = False        # IN: running_var from the variance pooled over the batch


def _read(t: torch.Tensor, bugs: Bugs) -> torch.Tensor:
    if bugs.ignore_strides and not t.is_contiguous():
        # Index the storage with contiguous strides from the tensor's first element.
        strides, acc = [], 1
        for size in reversed(t.shape):
            strides.insert(0, acc)
            acc *= size
        return t.as_strided(t.shape, strides)
    if bugs.ignore_storage_offset and t.storage_offset():
        return t.as_strided(t.shape, t.stride(), 0)
    return t


def _sum(a: torch.Tensor, axes, bugs: Bugs, low: torch.dtype, in_low: bool | None = None) -> torch.Tensor:
    """Sum over `axes` keeping dims; optionally (`in_low`, by default the low-precision-accumulation
    bug) like a 16-lane kernel accumulating in `low`."""
    in_low = bugs.low_precision_accumulation if in_low is None else in_low
    if not (in_low and low in (torch.float16, torch.bfloat16)):
        return a.sum(dim=axes, keepdim=True)
    kept = [d for d in range(a.dim()) if d not in axes]
    moved = a.permute(*kept, *axes)
    flat = moved.reshape(*moved.shape[: len(kept)], -1)
    pad = (-flat.shape[-1]) % LANES
    flat = torch.nn.functional.pad(flat, (0, pad)).reshape(*flat.shape[:-1], -1, LANES).to(low)
    lanes = torch.zeros_like(flat[..., 0, :])
    for step in range(flat.shape[-2]):
        lanes = lanes + flat[..., step, :]  # rounds to `low` after every add
    total = lanes.sum(dim=-1, dtype=low)
    shape = [1 if d in axes else s for d, s in enumerate(a.shape)]
    return total.to(a.dtype).reshape(shape)


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, view: SetView, eps, bugs: Bugs, stats_out):
        low = x.dtype
        acc = accumulation_dtype(x.dtype)
        axes = view.axes
        xs = view.group(_read(x, bugs).to(acc))
        count = view.set_size
        if bugs.per_sample_variance and view.across_batch:
            mu = xs.mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
            var = ((xs - xs.mean(dim=(2, 3), keepdim=True)) ** 2).mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
        else:
            mu = _sum(xs, axes, bugs, low) / count
            if bugs.naive_variance:
                var = _sum(xs * xs, axes, bugs, low) / count - mu * mu
            else:
                var = _sum((xs - mu) ** 2, axes, bugs, low) / count
        norm_var = var * count / (count - 1) if bugs.unbiased_normalise else var
        invstd = 1 / (norm_var.clamp_min(0).sqrt() + eps) if bugs.eps_outside_sqrt else (norm_var.clamp_min(0) + eps).rsqrt()
        if bugs.bf16_moments:
            mu, invstd = mu.to(torch.bfloat16).to(acc), invstd.to(torch.bfloat16).to(acc)
        xhat = (xs - mu) * invstd
        ones = torch.ones(view.param_shape, dtype=acc)
        gamma = view.per_channel_values(weight.to(acc) if weight is not None else ones)
        beta = view.per_channel_values(bias.to(acc) if bias is not None else 0 * ones)
        y = view.ungroup(xhat * gamma + beta).to(low)
        if bugs.modifies_input:
            x.sub_(view.ungroup(mu.expand_as(xs)).to(x.dtype))
        stats_out.update(mean=mu, var=var, count=count)
        ctx.save_for_backward(xhat, invstd, gamma)
        ctx.view, ctx.bugs, ctx.low = view, bugs, low
        ctx.param_dtypes = (None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, gamma = ctx.saved_tensors
        view, bugs, low = ctx.view, ctx.bugs, ctx.low
        axes, count = view.axes, view.set_size
        dys = view.group(_read(dy, bugs).to(xhat.dtype))
        if bugs.gamma_outside_group_sums:
            mean_g = gamma * _sum(dys, axes, bugs, low) / count
            mean_gx = gamma * _sum(dys * xhat, axes, bugs, low) / count
        else:
            mean_g = _sum(gamma * dys, axes, bugs, low) / count
            mean_gx = _sum(gamma * dys * xhat, axes, bugs, low) / count
        if bugs.drop_xhat_term:
            mean_gx = torch.zeros_like(mean_gx)
        dx = view.ungroup(invstd * (gamma * dys - mean_g - xhat * mean_gx)).to(low)
        xterm = xhat / invstd if bugs.dweight_missing_invstd else xhat
        wdt, bdt = ctx.param_dtypes
        def param_sum(a):  # over N and S: (N, K, L, S) -> the parameter's shape
            return _sum(a, (0, 3), bugs, low, bugs.low_precision_param_sums).reshape(view.param_shape)

        dweight = param_sum(dys * xterm).to(wdt) if wdt is not None else None
        dbias = param_sum(dys).to(bdt) if bdt is not None else None
        return dx, dweight, dbias, None, None, None, None


def _batch_norm(bugs: Bugs):
    def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5):
        stats = {}
        y = _Norm.apply(input, weight, bias, SetView.per_channel(tuple(input.shape)), eps, bugs, stats)
        mean, var, count = stats["mean"].reshape(-1), stats["var"].reshape(-1), stats["count"]
        _update_running(running_mean, running_var, mean, var, count, bugs, momentum)
        return y
    return batch_norm


def _update_running(running_mean, running_var, mean, var, count, bugs: Bugs, momentum: float):
    """running = (1 − m)·running + m·batch (unbiased variance), in the accumulation dtype, rounded once."""
    with torch.no_grad():
        running = var if bugs.biased_running_var else var * count / (count - 1)
        keep, take = (momentum, 1 - momentum) if bugs.momentum_swapped else (1 - momentum, momentum)
        running_mean.copy_(keep * running_mean.to(mean.dtype) + take * mean)
        running_var.copy_(keep * running_var.to(var.dtype) + take * running)


def _instance_norm(bugs: Bugs):
    def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                      momentum=0.1, eps=1e-5):
        shape = tuple(input.shape)
        view = SetView.per_channel(shape) if bugs.batch_statistics else SetView.per_group(shape, shape[1])
        stats = {}
        y = _Norm.apply(input, weight, bias, view, eps, bugs, stats)
        if running_mean is not None:
            n, c = shape[0], shape[1]
            mean, var, count = stats["mean"].reshape(-1, c), stats["var"].reshape(-1, c), stats["count"]
            if bugs.running_var_pooled:  # the batch's variance about its pooled mean: adds the spread of the means
                var = var + (mean - mean.mean(dim=0)) ** 2
            _update_running(running_mean, running_var, mean.mean(dim=0), var.mean(dim=0), count, bugs, momentum)
        return y
    return instance_norm


def _group_norm(bugs: Bugs):
    def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
        c = input.shape[1]
        if bugs.interleaved_groups:
            # Channel c joins group c % G: permute channels so that grouping is contiguous again.
            order = torch.arange(c).reshape(c // num_groups, num_groups).t().reshape(-1)
            inverse = torch.argsort(order)
            permuted = _group_norm(replace(bugs, interleaved_groups=False))(
                input[:, order], num_groups,
                None if weight is None else weight[order], None if bias is None else bias[order], eps)
            return permuted[:, inverse]
        return _Norm.apply(input, weight, bias, SetView.per_group(tuple(input.shape), num_groups), eps, bugs, {})
    return group_norm


def _layer_norm(bugs: Bugs):
    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        view = SetView.last_dims(tuple(input.shape), len(normalized_shape))
        return _Norm.apply(input, weight, bias, view, eps, bugs, {})
    return layer_norm


CORRECT = Bugs()


def batch_norm(bugs: Bugs = CORRECT):
    """F.batch_norm's signature, with `bugs` switched on."""
    return _batch_norm(bugs)


def group_norm(bugs: Bugs = CORRECT):
    """F.group_norm's signature, with `bugs` switched on."""
    return _group_norm(bugs)


def layer_norm(bugs: Bugs = CORRECT):
    return _layer_norm(bugs)


def instance_norm(bugs: Bugs = CORRECT):
    """F.instance_norm's signature (use_input_stats=True), with `bugs` switched on."""
    return _instance_norm(bugs)


def named(make, bug: str):
    """The mutant with one bug, named after it (so `--impl module:bug` finds it)."""
    fn = make(Bugs(**{bug: True}))
    fn.__qualname__ = bug
    return fn
