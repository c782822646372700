"""Residual add + norm implementations, correct and with the bug classes of real fused add + norm kernels, for
any inner norm (RMSNorm, LayerNorm): normalising x instead of x + residual, dropping the residual stream's own
gradient dh, updating the residual in place, handing the norm's gradient to x only, returning the stream from before
the add; in the form that returns y alone (returns=y), the norm's gradient handed to x only there too. And the bugs
that live only on a mixed stream (a float32 residual under half x, which the sweep passes): the sum rounded to x's
dtype before its statistics, the residual cast down to x's dtype before the add, h stored in x's dtype, dresidual
rounded to x's dtype. (A backward that recomputes from h saved in x's dtype is not one: its error is within what the
half-precision gradients allow.)

Three correct styles: `composed` (the project's textbook norm of h = x + residual, gradients through autograd),
`fused` (one autograd.Function as a fused kernel is written: the sum and its statistics in float32 registers,
h stored rounded to the stream's dtype, an explicit backward that adds dh) and `stats_from_sum` (the same Function
as a kernel that reads h back from the stream normalises it: the statistics of the unrounded sum in registers, the
stored, rounded h normalised with them).
"""
from __future__ import annotations

from math import prod

import torch

from normcheck.frameworks.torch import accumulation_dtype

from ._records import test_code

BUGS = ("normalises_x", "drops_dh", "rounds_sum_to_input", "residual_in_place", "norm_grad_to_x_only",
        "returns_stream_before_add", "casts_residual_down", "stores_h_in_input", "dresidual_in_input")
Y_ONLY_BUGS = ("y_only_grad_to_x_only",)  # of the form that returns y alone


class _FusedAddNorm(torch.autograd.Function):
    """h = x + residual and its statistics in the accumulation dtype; y = γ·x̂ (+ β) in x's dtype; h stored in the
    residual's dtype. Backward: the norm's closed form, recomputed from the stored h, plus dh."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, dims, eps, centred, bug, stats_from_sum):
        acc = accumulation_dtype(x.dtype)
        total = x.to(acc) + (residual.to(x.dtype) if bug == "casts_residual_down" else residual).to(acc)
        if bug == "rounds_sum_to_input":
            total = total.to(x.dtype).to(acc)
        h = total.to(x.dtype if bug == "stores_h_in_input" else residual.dtype).to(residual.dtype)
        # (a kernel that normalises the stored h with the sum's statistics keeps them for its backward too)
        ctx.save_for_backward(h, weight, total if stats_from_sum else None)
        ctx.dims, ctx.eps, ctx.centred, ctx.x_dtype, ctx.bug = dims, eps, centred, x.dtype, bug
        ctx.bias_dtype = None if bias is None else bias.dtype
        normalised = x if bug == "normalises_x" else h.to(acc) if stats_from_sum else total
        xhat, _ = _normalise(normalised, dims, eps, centred, stats_of=total if stats_from_sum else None)
        y = xhat * weight.to(acc) if weight is not None else xhat
        if bias is not None:
            y = y + bias.to(acc)
        return y.to(x.dtype), h

    @staticmethod
    def backward(ctx, dy, dh):
        h, weight, total = ctx.saved_tensors
        acc = accumulation_dtype(ctx.x_dtype)
        xhat, rstd = _normalise(h.to(acc), ctx.dims, ctx.eps, ctx.centred, stats_of=total)
        rows = prod(h.shape[: h.dim() - ctx.dims])
        dy_acc = dy.to(acc)
        g = (dy_acc * weight.to(acc) if weight is not None else dy_acc).reshape(rows, -1)
        xh = xhat.reshape(rows, -1)
        inner = g - xh * (g * xh).mean(dim=1, keepdim=True)
        if ctx.centred:
            inner = inner - g.mean(dim=1, keepdim=True)
        dnorm = (rstd.reshape(rows, 1) * inner).reshape(h.shape)
        total = dnorm if ctx.bug == "drops_dh" else dnorm + dh.to(acc)
        dx, dres = total, (dh.to(acc) if ctx.bug in ("norm_grad_to_x_only", "y_only_grad_to_x_only") else total)
        shape = h.shape[h.dim() - ctx.dims:]
        dweight = None if weight is None else (dy_acc * xhat).reshape(rows, -1).sum(0).reshape(shape).to(weight.dtype)
        dbias = None if ctx.bias_dtype is None else dy_acc.reshape(rows, -1).sum(0).reshape(shape).to(ctx.bias_dtype)
        if ctx.bug == "dresidual_in_input":
            dres = dres.to(ctx.x_dtype)
        return dx.to(ctx.x_dtype), dres.to(h.dtype), dweight, dbias, None, None, None, None, None


def _normalise(a, dims, eps, centred, stats_of=None):
    """(x̂, rstd) of `a` over its last `dims` dims, in a's dtype, with the statistics of `stats_of` (a's own: None)."""
    axes = tuple(range(a.dim() - dims, a.dim()))
    stats_of = a if stats_of is None else stats_of
    mean = stats_of.mean(dim=axes, keepdim=True) if centred else 0.0
    dev = stats_of - mean
    rstd = torch.rsqrt((dev * dev).mean(dim=axes, keepdim=True) + eps)
    return (a - mean) * rstd, rstd


def fused(centred: bool, default_eps, bug: str | None = None, stats_from_sum: bool = False):
    """The fused style, under the op's contract (with a bias argument for LayerNorm)."""
    def add_norm(input, residual, normalized_shape, weight=None, *rest):
        bias, eps = (rest if centred else (None, *rest))
        eps = default_eps(input.dtype) if eps is None else eps
        return _FusedAddNorm.apply(input, residual, weight, bias, len(normalized_shape), eps, centred, bug,
                                   stats_from_sum)
    return add_norm


def y_only(add_norm):
    """The form that returns y alone, of an add + norm that returns (y, h) (autograd gives h's cotangent as 0)."""
    def add_norm_y(*args):
        return add_norm(*args)[0]
    return add_norm_y


def composed(norm, bug: str | None = None):
    """The composed style: `norm` (the textbook norm, F's signature) of h = x + residual, through autograd."""
    def add_norm(input, residual, normalized_shape, *args):
        if bug == "residual_in_place":
            h = residual.add_(input.to(residual.dtype))
        else:
            h = input.to(residual.dtype) + residual
        if bug == "returns_stream_before_add":
            return norm(h, normalized_shape, *args).to(input.dtype), residual * 1
        return norm(input if bug == "normalises_x" else h, normalized_shape, *args).to(input.dtype), h
    return add_norm


def catalogue(op: str, norm, centred: bool, default_eps, follows: dict):
    """(MUTANTS, CORRECT) of an add + norm op: each bug in the style it is written in, and the two correct styles
    under torch's conventions (the sweep passes them both residual streams)."""
    alone = {**follows, "returns": "y"}

    def impl(name, fn, what, conventions=follows):
        return test_code(op, name, fn, what, conventions)

    mutants = {bug: impl(bug, (composed(norm, bug) if bug in ("residual_in_place", "returns_stream_before_add")
                               else fused(centred, default_eps, bug)),
                         f"mutant: {bug}") for bug in BUGS}
    mutants.update({bug: impl(bug, y_only(fused(centred, default_eps, bug)), f"mutant: {bug}", alone)
                    for bug in Y_ONLY_BUGS})
    # Normalising the stored h with the unrounded sum's statistics is right for an uncentred norm (h·rstd: rstd
    # within what rounding h moves it); a centred one that subtracts the sum's mean from h leaves every row off
    # centre by what rounding moved the mean, amplified by rstd: a bug
    stats_from_sum = impl("stats_from_sum", fused(centred, default_eps, stats_from_sum=True),
                          "the fused Function normalising the stored h with the unrounded sum's statistics")
    if centred:
        mutants["stats_from_sum"] = stats_from_sum
    correct = {"composed": impl("composed", composed(norm), "the textbook norm of x + residual, through autograd"),
               "fused": impl("fused", fused(centred, default_eps), "one fused Function, explicit backward"),
               **({} if centred else {"stats_from_sum": stats_from_sum}),
               "fused_y_only": impl("fused_y_only", y_only(fused(centred, default_eps)),
                                    "the fused Function returning y alone", alone)}
    return mutants, correct
