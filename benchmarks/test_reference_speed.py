"""Speed of the float64 reference (forward + backward), single-threaded.

Per case, side by side (``pytest benchmarks/ --benchmark-enable --benchmark-group-by=group``):

* ``reference``  -- ``*_norm_forward`` then ``*_norm_backward`` (statistics recomputed);
* ``torch``      -- torch float64 autograd forward + backward on the same inputs;
* ``stream``     -- the minimal memory traffic of any fwd+bwd: read x and dy, write y and dx
  (two ``np.copyto`` of x-sized arrays into preallocated arrays), measured in the same run;
* ``stream_alloc`` -- the same copies into freshly allocated arrays, i.e. including the
  first-touch cost of new output arrays, which every implementation that returns y and dx pays.

No timing is asserted (a benchmark is not a test); each body checks that its outputs are
right, so the smoke run (``--benchmark-disable``: every body once) also checks correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normcheck.reference import (
    batch_norm_backward,
    batch_norm_forward,
    group_norm_backward,
    group_norm_forward,
)

EPS = 1e-5
RTOL = 1e-11  # norm-wise, reference vs torch float64 on well-conditioned random data


@dataclass
class Case:
    name: str
    op: str  # "bn" | "gn"
    shape: tuple[int, ...]
    groups: int | None = None


CASES = [
    Case("bn-8x16x8x8", "bn", (8, 16, 8, 8)),
    Case("bn-32x64x56x56", "bn", (32, 64, 56, 56)),
    Case("gn-16x64x64x64-g8", "gn", (16, 64, 64, 64), groups=8),
]


@dataclass
class Inputs:
    case: Case
    x: np.ndarray
    dy: np.ndarray
    w: np.ndarray
    b: np.ndarray
    expected: dict  # torch float64 outputs, computed once


def _torch_fwd_bwd(case: Case, x, dy, w, b):
    """torch float64 autograd forward + backward; tensors share memory with the numpy inputs."""
    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()
    bt = torch.from_numpy(b).requires_grad_()
    if case.op == "bn":
        y = F.batch_norm(xt, None, None, wt, bt, training=True, momentum=0.1, eps=EPS)
    else:
        y = F.group_norm(xt, case.groups, wt, bt, EPS)
    dx, dw, db = torch.autograd.grad(y, (xt, wt, bt), torch.from_numpy(dy))
    return {"y": y.detach(), "dx": dx, "dweight": dw, "dbias": db}


def _reference_fwd_bwd(case: Case, x, dy, w, b):
    if case.op == "bn":
        fwd = batch_norm_forward(x, w, b, eps=EPS)
        bwd = batch_norm_backward(dy, x, w, eps=EPS)
    else:
        fwd = group_norm_forward(x, case.groups, w, b, eps=EPS)
        bwd = group_norm_backward(dy, x, case.groups, w, eps=EPS)
    return {"y": fwd.y, "dx": bwd.dx, "dweight": bwd.dweight, "dbias": bwd.dbias}


def _assert_matches(got: dict, expected: dict) -> None:
    for name, exp in expected.items():
        exp = np.asarray(exp)
        err = np.max(np.abs(np.asarray(got[name]) - exp)) / np.max(np.abs(exp))
        assert err <= RTOL, f"{name}: norm-wise relative error {err:.2e} > {RTOL:.0e}"


@pytest.fixture(scope="module", autouse=True)
def _torch_single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def inputs(request) -> Inputs:
    case = request.param
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case.shape) * 2.0 + 0.5
    dy = rng.standard_normal(case.shape)
    c = case.shape[1]
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    expected = {k: v.numpy() for k, v in _torch_fwd_bwd(case, x, dy, w, b).items()}
    return Inputs(case, x, dy, w, b, expected)


def test_reference(benchmark, inputs, record_median):
    benchmark.group = inputs.case.name
    i = inputs
    got = benchmark(_reference_fwd_bwd, i.case, i.x, i.dy, i.w, i.b)
    _assert_matches(got, i.expected)
    record_median(benchmark, i.case.name, "reference")


def test_torch_autograd(benchmark, inputs, record_median):
    benchmark.group = inputs.case.name
    i = inputs
    got = benchmark(_torch_fwd_bwd, i.case, i.x, i.dy, i.w, i.b)
    _assert_matches({k: v.numpy() for k, v in got.items()}, i.expected)
    record_median(benchmark, i.case.name, "torch")


def test_stream(benchmark, inputs, record_median):
    """Read x and dy, write y and dx: the bytes any fwd+bwd must move, preallocated outputs."""
    benchmark.group = inputs.case.name
    i = inputs
    y, dx = np.empty_like(i.x), np.empty_like(i.dy)

    def stream():
        np.copyto(y, i.x)
        np.copyto(dx, i.dy)

    benchmark(stream)
    assert np.array_equal(y, i.x) and np.array_equal(dx, i.dy)
    record_median(benchmark, i.case.name, "stream")


def test_stream_alloc(benchmark, inputs, record_median):
    """The same traffic into fresh arrays (first-touch page faults included)."""
    benchmark.group = inputs.case.name
    i = inputs
    y, dx = benchmark(lambda: (i.x.copy(), i.dy.copy()))
    assert np.array_equal(y, i.x) and np.array_equal(dx, i.dy)
    record_median(benchmark, i.case.name, "stream_alloc")
