"""The float64 reference is itself verified.

* central finite differences of the scalar loss sum(y * dy) on small cases;
* torch float64 (native ops for the saved statistics, autograd for the gradients) on
  hypothesis-generated cases, to 1e-12 relative to the magnitude of the terms that make up
  each output (its largest element for y-like outputs; for dx, dweight and xhat-dependent
  values the size of what cancels, including |mean| * rstd -- see ``xhat_terms``);
* identities of the backward: sum(dx) = 0 and sum(dx * xhat) = eps * rstd**3 * sum(g * xhat)
  per normalisation set (0 for eps = 0), dbias = sum(dy);
* input validation, degenerate (constant) sets, inputs left untouched, no torch import.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from normcheck.reference import (
    BatchNormForward,
    GroupNormForward,
    NormBackward,
    batch_norm_backward,
    batch_norm_forward,
    group_norm_backward,
    group_norm_forward,
)

TORCH_RTOL = 1e-12  # float64 vs float64: only summation order differs
FD_RTOL = 1e-7  # central differences, step 1e-6 relative: O(h^2) + O(u/h) ~ 1e-10


# --------------------------------------------------------------------------------- helpers


def rel_err(actual, expected, scale=None) -> float:
    """Error of ``actual`` relative to a magnitude.

    Without ``scale``: max |actual - expected| / max |expected| (norm-wise).  With ``scale``
    (broadcastable to the arrays): max over elements of |actual - expected| / scale, where
    ``scale`` is the magnitude of the terms that make up each element (an element whose scale
    is 0 must match exactly).
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.size == 0:
        return 0.0
    diff = np.abs(actual - expected)
    if scale is None:
        top = np.max(np.abs(expected))
        return float(np.max(diff) / top) if top > 0 else float(np.max(diff))
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), diff.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, diff / scale, np.where(diff == 0, 0.0, np.inf))
    return float(np.max(ratio))


def assert_close(name: str, actual, expected, rtol: float, context: str = "") -> None:
    err = rel_err(actual, expected)
    assert err <= rtol, f"{name}: relative error {err:.3e} > {rtol:.0e} {context}"


def spatial_axes(ndim: int) -> tuple[int, ...]:
    return (0,) + tuple(range(2, ndim))


def bn_loss(x, w, b, dy, eps):
    return float(np.sum(batch_norm_forward(x, w, b, eps=eps).y * dy))


def gn_loss(x, groups, w, b, dy, eps):
    return float(np.sum(group_norm_forward(x, groups, w, b, eps=eps).y * dy))


def central_difference(f, a: np.ndarray, rel_step: float = 1e-6) -> np.ndarray:
    """d f / d a, elementwise central differences with a step relative to |a_i| (>= 1e-6)."""
    grad = np.empty_like(a)
    for i in np.ndindex(a.shape):
        h = rel_step * max(1.0, abs(a[i]))
        orig = a[i]
        a[i] = orig + h
        up = f()
        a[i] = orig - h
        down = f()
        a[i] = orig
        grad[i] = (up - down) / (2 * h)
    return grad


def t64(a):
    return None if a is None else torch.tensor(a, dtype=torch.float64)


# --------------------------------------------------------------- finite differences (float64)

FD_CASES = [  # (shape, num_groups for GN: C/G > 1 wherever C > 1)
    ((3, 2, 2), 1),
    ((2, 4, 3), 2),
    ((2, 2, 2, 2, 2), 1),
    ((4, 3), 1),
    ((2, 6, 2, 2), 3),
]


@pytest.mark.parametrize("shape", [shape for shape, _ in FD_CASES], ids=str)
def test_batch_norm_backward_matches_finite_differences(shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 1.5 + 0.7
    dy = rng.standard_normal(shape)
    c = shape[1]
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    eps = 1e-3

    got = batch_norm_backward(dy, x, w, eps=eps)
    loss = lambda: bn_loss(x, w, b, dy, eps)
    assert_close("dx", got.dx, central_difference(loss, x), FD_RTOL)
    assert_close("dweight", got.dweight, central_difference(loss, w), FD_RTOL)
    assert_close("dbias", got.dbias, central_difference(loss, b), FD_RTOL)


@pytest.mark.parametrize("shape,groups", FD_CASES, ids=str)
def test_group_norm_backward_matches_finite_differences(shape, groups):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape) * 1.5 + 0.7
    dy = rng.standard_normal(shape)
    c = shape[1]
    w = rng.standard_normal(c) + 1.0  # varies inside each group
    b = rng.standard_normal(c)
    eps = 1e-3

    got = group_norm_backward(dy, x, groups, w, eps=eps)
    loss = lambda: gn_loss(x, groups, w, b, dy, eps)
    assert_close("dx", got.dx, central_difference(loss, x), FD_RTOL)
    assert_close("dweight", got.dweight, central_difference(loss, w), FD_RTOL)
    assert_close("dbias", got.dbias, central_difference(loss, b), FD_RTOL)


def test_finite_difference_check_can_fail():
    """A plausible wrong backward (no xhat*mean(dy*xhat) term) is far outside FD_RTOL."""
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 2, 2))
    fwd = batch_norm_forward(x, eps=1e-3)
    inv = fwd.invstd[None, :, None]
    wrong = inv * (dy - dy.mean(axis=(0, 2), keepdims=True))
    fd = central_difference(lambda: float(np.sum(batch_norm_forward(x, eps=1e-3).y * dy)), x)
    assert rel_err(wrong, fd) > 1e3 * FD_RTOL


# ------------------------------------------------------------------ torch float64 (hypothesis)


@st.composite
def norm_cases(draw, op: str):
    ndim = draw(st.integers(2, 5))
    n = draw(st.integers(1, 4))
    if op == "gn":
        groups = draw(st.integers(1, 4))
        c = groups * draw(st.integers(1, 3))
    else:
        groups = None
        c = draw(st.integers(1, 5))
    spatial = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim - 2, max_size=ndim - 2)))
    shape = (n, c) + spatial
    if op == "bn" and n * math.prod(spatial) < 2:  # torch F.batch_norm rejects M < 2 in training
        shape = (2, c) + spatial
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # Offsets up to 100 std.  float64 gives xhat only to ~u * |mean| / std, and the scales in
    # the checks grow accordingly; bounding the offset keeps the 1e-12 comparison tight
    # (large offsets are the value profiles' business).
    scale = 10.0 ** draw(st.floats(-2, 2))
    offset = scale * draw(st.floats(-100, 100))
    x = rng.standard_normal(shape) * scale + offset
    dy = rng.standard_normal(shape) * 10.0 ** draw(st.floats(-2, 2))
    w = rng.standard_normal(c) if draw(st.booleans()) else None
    b = rng.standard_normal(c) if draw(st.booleans()) else None
    eps = 10.0 ** draw(st.floats(-8, -1))
    case = {"x": x, "dy": dy, "w": w, "b": b, "eps": eps, "groups": groups}
    if op == "bn":
        case["momentum"] = draw(st.floats(0.0, 1.0))
        if draw(st.booleans()):
            case["rm"] = rng.standard_normal(c)
            case["rv"] = rng.uniform(0.5, 2.0, c)
        else:
            case["rm"] = case["rv"] = None
    return case


def torch_batch_norm(x, dy, w, b, rm, rv, momentum, eps):
    """(y, save_mean, save_invstd, running_mean, running_var, dx, dweight, dbias) in float64."""
    xt = t64(x).requires_grad_()
    wt = None if w is None else t64(w).requires_grad_()
    bt = None if b is None else t64(b).requires_grad_()
    rmt, rvt = t64(rm), t64(rv)
    y, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
        xt.detach(), t64(w), t64(b), rmt, rvt, True, momentum, eps
    )
    y_ag = F.batch_norm(xt, None, None, wt, bt, training=True, momentum=momentum, eps=eps)
    leaves = [t for t in (xt, wt, bt) if t is not None]
    grads = iter(torch.autograd.grad(y_ag, leaves, t64(dy)))
    dx = next(grads)
    dw = next(grads) if wt is not None else None
    db = next(grads) if bt is not None else None
    np_ = lambda t: None if t is None else t.detach().numpy()
    return tuple(map(np_, (y, save_mean, save_invstd, rmt, rvt, dx, dw, db)))


def torch_group_norm(x, dy, groups, w, b, eps):
    """(y, mean (N, G), rstd (N, G), dx, dweight, dbias) in float64."""
    n, c = x.shape[:2]
    hxw = math.prod(x.shape[2:])
    xt = t64(x).requires_grad_()
    wt = None if w is None else t64(w).requires_grad_()
    bt = None if b is None else t64(b).requires_grad_()
    # The aten op rather than F.group_norm, which rejects N * C/G * prod(spatial) == 1.  Its
    # backward fails ("tensor does not have a device") for weight=None with a bias, so a
    # missing weight is passed as constant ones -- the same function.
    w_arg = torch.ones(c, dtype=torch.float64) if wt is None else wt
    y_ag, mean, rstd = torch.ops.aten.native_group_norm(xt, w_arg, bt, n, c, hxw, groups, eps)
    y = y_ag.detach()
    leaves = [t for t in (xt, wt, bt) if t is not None]
    grads = iter(torch.autograd.grad(y_ag, leaves, t64(dy)))
    dx = next(grads)
    dw = next(grads) if wt is not None else None
    db = next(grads) if bt is not None else None
    np_ = lambda t: None if t is None else t.detach().numpy()
    return tuple(map(np_, (y, mean, rstd, dx, dw, db)))


def channel_shape(x: np.ndarray) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.ndim - 2)


def xhat_terms(x, mean, rstd, set_mean) -> tuple[np.ndarray, np.ndarray]:
    """How big the rounding-error terms of xhat = (x - mean) * rstd are, per element (in u).

    ``x - mean`` is good to ~u*(|x| + |mean|) (the mean itself carries ~u*|mean|), and rstd,
    through var = mean((x - mean)**2), to a relative ~u*m with m = mean(|xhat| * (|x| +
    |mean|) * rstd) over the set.  So xhat_i is good to ~u*e_i with
    e_i = (|x_i| + |mean|) * rstd + |xhat_i| * m.  For data centred within a few std, e ~ |xhat|
    and m ~ 1; when |mean| >> std they grow, and float64 (torch's and ours) cannot do better.
    Returns (e, 1 + m), broadcast to x.
    """
    xhat = (x - mean) * rstd
    mag = (np.abs(x) + np.abs(mean)) * rstd
    m = set_mean(np.abs(xhat) * mag)
    return mag + np.abs(xhat) * m, 1.0 + m


def dx_scale(gdy, e, rstd_factor, rstd, set_mean) -> np.ndarray:
    """Magnitude of the terms of dx = rstd*(g - mean(g) - xhat*mean(g*xhat)), per element.

    dx itself can be ~0 (a set of two values has xhat = +-1 whatever x is), so dx is compared
    against the size of what cancels in it (with |xhat| -> e and rstd's own relative error),
    not against its own size.
    """
    g = np.abs(gdy)
    return rstd * rstd_factor * (g + set_mean(g) + e * set_mean(g * e))


def y_scale(e, x, w, b) -> np.ndarray:
    """Magnitude of the terms of y = gamma*xhat + beta, per element."""
    gam = 1.0 if w is None else np.abs(w.reshape(channel_shape(x)))
    beta = 0.0 if b is None else np.abs(b.reshape(channel_shape(x)))
    return gam * e + beta


def check_against_torch_bn(case) -> dict[str, float]:
    x, dy, w, b, eps = case["x"], case["dy"], case["w"], case["b"], case["eps"]
    rm, rv, momentum = case["rm"], case["rv"], case["momentum"]
    fwd = batch_norm_forward(x, w, b, rm, rv, momentum=momentum, eps=eps)
    bwd = batch_norm_backward(dy, x, w, eps=eps, has_bias=b is not None)
    ty, tmean, tinv, trm, trv, tdx, tdw, tdb = torch_batch_norm(x, dy, w, b, rm, rv, momentum, eps)

    cs = channel_shape(x)
    axes = spatial_axes(x.ndim)
    rstd = fwd.invstd.reshape(cs)

    def set_mean(a):
        return np.broadcast_to(a.mean(axis=axes, keepdims=True), a.shape)

    e, rstd_factor = xhat_terms(x, fwd.mean.reshape(cs), rstd, set_mean)
    gdy = dy if w is None else dy * w.reshape(cs)
    errs = {
        "y": rel_err(fwd.y, ty, scale=y_scale(e, x, w, b)),
        "mean": rel_err(fwd.mean, tmean, scale=np.max(np.abs(x))),
        "invstd": rel_err(fwd.invstd, tinv, scale=tinv * rstd_factor.max(axis=axes)),
        "dx": rel_err(bwd.dx, tdx, scale=dx_scale(gdy, e, rstd_factor, rstd, set_mean)),
    }
    if rm is not None:
        # (1 - momentum) * running + momentum * batch statistic, each term with its own error
        mom = momentum
        batch_var = fwd.running_var - (1 - mom) * rv  # momentum * unbiased var
        errs["running_mean"] = rel_err(
            fwd.running_mean, trm, scale=(1 - mom) * np.abs(rm) + mom * np.max(np.abs(x))
        )
        errs["running_var"] = rel_err(
            fwd.running_var, trv,
            scale=(1 - mom) * np.abs(rv) + np.abs(batch_var) * rstd_factor.max(axis=axes),
        )
    else:
        assert fwd.running_mean is None and fwd.running_var is None
    sums = {"dweight": np.abs(dy * e).sum(axis=axes), "dbias": np.abs(dy).sum(axis=axes)}
    for name, ours, theirs in (("dweight", bwd.dweight, tdw), ("dbias", bwd.dbias, tdb)):
        assert (ours is None) == (theirs is None), name
        if ours is not None:
            errs[name] = rel_err(ours, theirs, scale=sums[name])
    return errs


def check_against_torch_gn(case) -> dict[str, float]:
    x, dy, w, b, eps, groups = (case[k] for k in ("x", "dy", "w", "b", "eps", "groups"))
    fwd = group_norm_forward(x, groups, w, b, eps=eps)
    bwd = group_norm_backward(dy, x, groups, w, eps=eps, has_bias=b is not None)
    ty, tmean, trstd, tdx, tdw, tdb = torch_group_norm(x, dy, groups, w, b, eps)

    n = x.shape[0]

    def per_set(a):  # (N, G) -> broadcast to x
        return np.broadcast_to(a[..., None], (n, groups, x[0].size // groups)).reshape(x.shape)

    def set_mean(a):
        return per_set(a.reshape(n, groups, -1).mean(axis=2))

    rstd = per_set(fwd.rstd)
    e, rstd_factor = xhat_terms(x, per_set(fwd.mean), rstd, set_mean)
    gdy = dy if w is None else dy * w.reshape(channel_shape(x))
    axes = spatial_axes(x.ndim)
    errs = {
        "y": rel_err(fwd.y, ty, scale=y_scale(e, x, w, b)),
        "mean": rel_err(fwd.mean, tmean, scale=np.max(np.abs(x))),
        "rstd": rel_err(fwd.rstd, trstd, scale=trstd * rstd_factor.reshape(n, groups, -1).max(axis=2)),
        "dx": rel_err(bwd.dx, tdx, scale=dx_scale(gdy, e, rstd_factor, rstd, set_mean)),
    }
    sums = {"dweight": np.abs(dy * e).sum(axis=axes), "dbias": np.abs(dy).sum(axis=axes)}
    for name, ours, theirs in (("dweight", bwd.dweight, tdw), ("dbias", bwd.dbias, tdb)):
        assert (ours is None) == (theirs is None), name
        if ours is not None:
            errs[name] = rel_err(ours, theirs, scale=sums[name])
    return errs


def describe(case) -> str:
    return (
        f"shape={case['x'].shape} groups={case['groups']} eps={case['eps']:.3g} "
        f"weight={case['w'] is not None} bias={case['b'] is not None}"
    )


@settings(deadline=None, max_examples=400)
@given(norm_cases("bn"))
def test_batch_norm_matches_torch_float64(case):
    errs = check_against_torch_bn(case)
    bad = {k: v for k, v in errs.items() if not v <= TORCH_RTOL}
    assert not bad, f"batch_norm vs torch: {bad} ({describe(case)})"


@settings(deadline=None, max_examples=400)
@given(norm_cases("gn"))
def test_group_norm_matches_torch_float64(case):
    errs = check_against_torch_gn(case)
    bad = {k: v for k, v in errs.items() if not v <= TORCH_RTOL}
    assert not bad, f"group_norm vs torch: {bad} ({describe(case)})"


def test_torch_comparison_can_fail():
    """Plausible mistakes are caught by the 1e-12 comparison, by orders of magnitude."""
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 3, 5))
    _, _, tinv, *_ = torch_batch_norm(x, dy, None, None, None, None, 0.1, 1e-5)
    unbiased = 1 / np.sqrt(x.var(axis=(0, 2), ddof=1) + 1e-5)
    assert rel_err(unbiased, tinv) > 1e6 * TORCH_RTOL
    _, _, _, tdx, _, _ = torch_group_norm(x, dy, 3, None, None, 1e-5)
    as_if_bn = batch_norm_backward(dy, x).dx  # GroupNorm with G = C is not BatchNorm
    assert rel_err(as_if_bn, tdx) > 1e6 * TORCH_RTOL


def test_batch_norm_single_value_per_channel_without_running_stats():
    """M = 1 is allowed without running_var: var = 0, y = beta (torch native_batch_norm)."""
    x = np.array([[1.0, -2.0, 5.0]])
    w, b = np.array([2.0, 3.0, 4.0]), np.array([0.5, -1.0, 2.0])
    fwd = batch_norm_forward(x, w, b, eps=1e-5)
    _, mean, invstd = torch.ops.aten.native_batch_norm(
        t64(x), t64(w), t64(b), None, None, True, 0.1, 1e-5
    )
    np.testing.assert_array_equal(fwd.y, b[None])
    np.testing.assert_array_equal(fwd.mean, mean.numpy())
    assert rel_err(fwd.invstd, invstd.numpy()) <= TORCH_RTOL
    bwd = batch_norm_backward(np.array([[1.0, 2.0, 3.0]]), x, w)
    np.testing.assert_array_equal(bwd.dx, 0.0)  # dy - mean(dy) = 0 for a single value


# --------------------------------------------------------------------------------- identities


def set_sums(a: np.ndarray, op: str, groups: int | None) -> np.ndarray:
    """Sum of ``a`` over each normalisation set: BN -> (C,), GN -> (N, G)."""
    if op == "bn":
        return a.sum(axis=spatial_axes(a.ndim))
    n = a.shape[0]
    return a.reshape(n, groups, -1).sum(axis=2)


def xhat_of(x, op, groups, eps):
    if op == "bn":
        f = batch_norm_forward(x, eps=eps)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return (x - f.mean.reshape(shape)) * f.invstd.reshape(shape), f.invstd
    f = group_norm_forward(x, groups, eps=eps)
    n = x.shape[0]
    xs = x.reshape(n, groups, -1)
    return ((xs - f.mean[..., None]) * f.rstd[..., None]).reshape(x.shape), f.rstd


IDENTITY_CASES = [
    ("bn", (8, 3, 5, 4), None, "random"),
    ("bn", (16, 4), None, "random"),
    ("bn", (2, 3, 2, 3, 4), None, "random"),
    ("gn", (3, 6, 7, 5), 3, "random"),  # gamma varies inside the groups
    ("gn", (3, 6, 7, 5), 3, "constant-per-group"),
    ("gn", (4, 8, 9), 2, None),
    ("gn", (2, 4, 3, 3, 2), 4, "random"),
]


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.1])
@pytest.mark.parametrize("op,shape,groups,weight", IDENTITY_CASES)
def test_backward_identities(op, shape, groups, weight, eps):
    """Per set, with g = gamma * dy:  sum(dx) = 0  and
    sum(dx * xhat) = rstd * sum(g * xhat) * (1 - mean(xhat**2)) = eps * rstd**3 * sum(g * xhat),
    which is 0 for eps = 0; dbias = sum(dy) per channel.  (Both identities hold even when gamma
    varies inside a GroupNorm group.)"""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape) * 3.0 + 2.0
    dy = rng.standard_normal(shape)
    c = shape[1]
    if weight == "random":
        w = rng.standard_normal(c)
    elif weight == "constant-per-group":
        w = np.repeat(rng.standard_normal(groups), c // groups)
    else:
        w = None
    if op == "bn":
        bwd = batch_norm_backward(dy, x, w, eps=eps)
    else:
        bwd = group_norm_backward(dy, x, groups, w, eps=eps)
    xhat, rstd = xhat_of(x, op, groups, eps)
    gam = np.ones(c) if w is None else w
    g = dy * gam.reshape((1, -1) + (1,) * (x.ndim - 2))

    scale = set_sums(np.abs(bwd.dx), op, groups)
    assert np.all(np.abs(set_sums(bwd.dx, op, groups)) <= 1e-12 * scale)

    expected = eps * rstd**3 * set_sums(g * xhat, op, groups)
    scale = set_sums(np.abs(bwd.dx * xhat), op, groups)
    got = set_sums(bwd.dx * xhat, op, groups)
    assert np.all(np.abs(got - expected) <= 1e-12 * scale), (got, expected)

    assert_close("dbias", bwd.dbias, dy.sum(axis=spatial_axes(dy.ndim)), 1e-13)
    if w is not None:
        assert_close("dweight", bwd.dweight, (dy * xhat).sum(axis=spatial_axes(dy.ndim)), 1e-12)
    else:
        assert bwd.dweight is None


def test_none_outputs_follow_weight_and_bias():
    rng = np.random.default_rng(6)
    x, dy = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3))
    w = rng.standard_normal(4)
    for backward in (
        lambda **kw: batch_norm_backward(dy, x, **kw),
        lambda **kw: group_norm_backward(dy, x, 2, **kw),
    ):
        r = backward(weight=None, has_bias=True)
        assert r.dweight is None and r.dbias is not None
        r = backward(weight=w, has_bias=False)
        assert r.dweight is not None and r.dbias is None
        r = backward(weight=None, has_bias=False)
        assert isinstance(r, NormBackward) and r.dweight is None and r.dbias is None


# -------------------------------------------------------------------------------- bad input

def _bad_calls():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 3))
    bn_f, bn_b = batch_norm_forward, batch_norm_backward
    gn_f, gn_b = group_norm_forward, group_norm_backward
    return [
        ("bn fwd x 1-D", lambda: bn_f(np.zeros(4)), "2 to 5 dims"),
        ("bn fwd x 6-D", lambda: bn_f(np.zeros((2, 2, 1, 1, 1, 2))), "2 to 5 dims"),
        ("bn bwd x 1-D", lambda: bn_b(np.zeros(4), np.zeros(4)), "2 to 5 dims"),
        ("gn fwd x 6-D", lambda: gn_f(np.zeros((2, 2, 1, 1, 1, 2)), 1), "2 to 5 dims"),
        ("gn bwd x 1-D", lambda: gn_b(np.zeros(4), np.zeros(4), 1), "2 to 5 dims"),
        ("bn weight", lambda: bn_f(x, weight=np.ones(3)), r"weight must have shape \(4,\)"),
        ("bn bias", lambda: bn_f(x, bias=np.ones((4, 1))), r"bias must have shape \(4,\)"),
        ("bn running_mean", lambda: bn_f(x, running_mean=np.ones(5), running_var=np.ones(4)), "running_mean must have shape"),
        ("bn running_var", lambda: bn_f(x, running_mean=np.ones(4), running_var=np.ones(2)), "running_var must have shape"),
        ("bn bwd weight", lambda: bn_b(x, x, weight=np.ones(2)), r"weight must have shape \(4,\)"),
        ("gn weight", lambda: gn_f(x, 2, weight=np.ones(2)), r"weight must have shape \(4,\)"),
        ("gn bias", lambda: gn_f(x, 2, bias=np.ones(8)), r"bias must have shape \(4,\)"),
        ("gn bwd weight", lambda: gn_b(x, x, 2, weight=np.ones(3)), r"weight must have shape \(4,\)"),
        ("bn dy shape", lambda: bn_b(np.zeros((2, 4, 4)), x), "dy must have the shape of x"),
        ("gn dy shape", lambda: gn_b(np.zeros((2, 4)), x, 2), "dy must have the shape of x"),
        ("gn C % G", lambda: gn_f(x, 3), "divisible by num_groups=3"),
        ("gn bwd C % G", lambda: gn_b(x, x, 3), "divisible by num_groups=3"),
        ("gn G = 0", lambda: gn_f(x, 0), "num_groups must be a positive integer"),
        ("gn G < 0", lambda: gn_f(x, -2), "num_groups must be a positive integer"),
        ("gn G float", lambda: gn_f(x, 2.0), "num_groups must be a positive integer"),
        ("bn M < 2", lambda: bn_f(np.zeros((1, 3)), running_mean=np.zeros(3), running_var=np.ones(3)),
         "Expected more than 1 value per channel when training"),
        ("bn M < 2 spatial", lambda: bn_f(np.zeros((1, 3, 1, 1)), running_mean=np.zeros(3), running_var=np.ones(3)),
         "Expected more than 1 value per channel when training"),
        ("bn empty", lambda: bn_f(np.zeros((0, 3))), "at least one value per channel"),
        ("gn empty set", lambda: gn_f(np.zeros((2, 0, 3)), 1), "at least one value"),
        ("bn fwd eps", lambda: bn_f(x, eps=-1e-5), "eps must be >= 0"),
        ("bn bwd eps", lambda: bn_b(x, x, eps=-1.0), "eps must be >= 0"),
        ("gn fwd eps", lambda: gn_f(x, 2, eps=-1e-5), "eps must be >= 0"),
        ("gn bwd eps", lambda: gn_b(x, x, 2, eps=float("nan")), "eps must be >= 0"),
    ]


@pytest.mark.parametrize("call,pattern", [c[1:] for c in _bad_calls()], ids=[c[0] for c in _bad_calls()])
def test_bad_input_raises_one_line_value_error(call, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        call()
    assert "\n" not in str(info.value)


def test_group_norm_empty_batch_is_allowed():
    """torch's native_group_norm accepts N = 0; so does the reference."""
    f = group_norm_forward(np.zeros((0, 4, 3)), 2)
    assert f.y.shape == (0, 4, 3) and f.mean.shape == (0, 2) and f.rstd.shape == (0, 2)
    r = group_norm_backward(np.zeros((0, 4, 3)), np.zeros((0, 4, 3)), 2, weight=np.ones(4))
    np.testing.assert_array_equal(r.dweight, np.zeros(4))
    np.testing.assert_array_equal(r.dbias, np.zeros(4))


# -------------------------------------------------------------------- constant (var = 0) sets


@pytest.mark.parametrize("op", ["bn", "gn"])
def test_constant_sets_give_zero_xhat_and_finite_gradients(op):
    """var = 0 exactly: xhat = 0, y = beta, dx = gamma*rstd*(dy - mean(dy)) (finite)."""
    rng = np.random.default_rng(7)
    shape = (3, 4, 5, 2)
    x = np.full(shape, 3.0)  # 3.0 * M is exact, so mean == 3.0 and x - mean == 0 exactly
    x[:, 1] = -0.5
    dy = rng.standard_normal(shape)
    w, b = rng.standard_normal(4), rng.standard_normal(4)
    eps = 1e-5
    bshape = (1, 4, 1, 1)
    if op == "bn":
        f = batch_norm_forward(x, w, b, eps=eps)
        r = batch_norm_backward(dy, x, w, eps=eps)
        rstd = f.invstd.reshape(bshape)
        expected_dx = w.reshape(bshape) * rstd * (dy - dy.mean(axis=(0, 2, 3), keepdims=True))
    else:
        f = group_norm_forward(x, 4, w, b, eps=eps)  # one channel per group: constant sets
        r = group_norm_backward(dy, x, 4, w, eps=eps)
        rstd = f.rstd[:, :, None, None]
        expected_dx = w.reshape(bshape) * rstd * (dy - dy.mean(axis=(2, 3), keepdims=True))
    np.testing.assert_array_equal(rstd, 1 / np.sqrt(eps))
    np.testing.assert_array_equal(f.y, np.broadcast_to(b.reshape(bshape), shape))
    assert np.all(np.isfinite(r.dx))
    assert_close("dx", r.dx, expected_dx, 1e-14)
    np.testing.assert_array_equal(r.dweight, 0.0)  # xhat == 0


def test_near_constant_channel_matches_torch():
    """A channel whose spread is far below sqrt(eps) (var ~ 1e-20 << eps) stays finite and agrees."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 6))
    x[:, 2] = 0.1 + 1e-10 * rng.standard_normal((4, 6))
    case = {
        "x": x, "dy": rng.standard_normal(x.shape), "w": rng.standard_normal(3),
        "b": rng.standard_normal(3), "eps": 1e-5, "groups": 3, "momentum": 0.1,
        "rm": np.zeros(3), "rv": np.ones(3),
    }
    for errs in (check_against_torch_bn(case), check_against_torch_gn(case)):
        assert all(v <= TORCH_RTOL for v in errs.values()), errs


# ------------------------------------------------------------- input handling, import hygiene


def test_inputs_are_not_modified_and_may_be_read_only():
    rng = np.random.default_rng(9)
    arrays = {
        "x": rng.standard_normal((3, 4, 5)),
        "dy": rng.standard_normal((3, 4, 5)),
        "w": rng.standard_normal(4),
        "b": rng.standard_normal(4),
        "rm": rng.standard_normal(4),
        "rv": rng.uniform(0.5, 1.5, 4),
    }
    copies = {k: v.copy() for k, v in arrays.items()}
    for v in arrays.values():
        v.flags.writeable = False
    a = arrays
    f = batch_norm_forward(a["x"], a["w"], a["b"], a["rm"], a["rv"], momentum=0.3)
    batch_norm_backward(a["dy"], a["x"], a["w"])
    group_norm_forward(a["x"], 2, a["w"], a["b"])
    group_norm_backward(a["dy"], a["x"], 2, a["w"])
    for k, v in arrays.items():
        np.testing.assert_array_equal(v, copies[k], err_msg=k)
    # results are new arrays, not views of the inputs
    for out in (f.y, f.running_mean, f.running_var):
        assert not any(np.shares_memory(out, v) for v in arrays.values())


def test_any_float_dtype_and_strides_give_the_float64_result():
    rng = np.random.default_rng(10)
    base = rng.standard_normal((3, 5, 4, 6))
    dy = rng.standard_normal((3, 5, 4, 6))
    x32 = base.astype(np.float32)
    strided = np.asfortranarray(x32.astype(np.float64))[:, :, :, ::-1][:, :, :, ::-1]
    x64 = x32.astype(np.float64)
    dy_t = np.ascontiguousarray(dy.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # channels-last
    w16 = rng.standard_normal(5).astype(np.float16)
    for xin in (x32, strided):
        np.testing.assert_array_equal(
            batch_norm_forward(xin, w16).y, batch_norm_forward(x64, w16.astype(np.float64)).y
        )
        np.testing.assert_array_equal(
            group_norm_backward(dy_t, xin, 5, w16).dx,
            group_norm_backward(dy, x64, 5, w16.astype(np.float64)).dx,
        )


def test_result_types():
    x = np.random.default_rng(11).standard_normal((2, 4, 3))
    assert isinstance(batch_norm_forward(x), BatchNormForward)
    assert isinstance(group_norm_forward(x, 2), GroupNormForward)
    assert isinstance(batch_norm_backward(x, x), NormBackward)
    assert isinstance(group_norm_backward(x, x, 2), NormBackward)


def test_reference_imports_without_torch():
    """normcheck.reference runs with every ``import torch`` failing.

    The ``normcheck`` package object is stubbed so that the check covers the reference
    subpackage itself, whatever the top-level package chooses to import.
    """
    pkg_dir = importlib.util.find_spec("normcheck").submodule_search_locations[0]
    code = textwrap.dedent(
        f"""
        import sys, types
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        pkg = types.ModuleType("normcheck")
        pkg.__path__ = [{pkg_dir!r}]
        sys.modules["normcheck"] = pkg
        import numpy as np
        import normcheck.reference as ref
        x = np.arange(24.0).reshape(2, 4, 3)
        ref.batch_norm_backward(x, x, np.ones(4))
        ref.group_norm_backward(x, x, 2, np.ones(4))
        loaded = [m for m, v in sys.modules.items() if v is not None and m.split(".")[0] == "torch"]
        assert not loaded, loaded
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
