"""normcheck's channels-last GroupNorm kernel (normcheck.kernels.groupnorm) against the float64 reference.

The first test to run builds the kernel (~40 s once; cached under ~/.cache/normcheck/groupnorm).
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from math import prod

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from normcheck.frameworks.torch import differentiate, torch_inputs
from normcheck.ops import OPS
from normcheck import compare
from normcheck.cases import Case
from normcheck.engine import KNOWN, MISTRUSTED, PASS, SKIP

OK = (PASS, MISTRUSTED)  # MISTRUSTED: right, but the reference is mostly zeros (proves little)
from normcheck.numerics.dtypes import DTYPE_CHOICES, parse_dtype
from normcheck.numerics.profiles import PROFILES
from normcheck.ops import Impl
from normcheck.numerics.formats import formats_for

gn = pytest.importorskip("normcheck.kernels.groupnorm")
from normcheck.kernels.groupnorm import impls as gn_impls

OURS = {i.name: i for i in gn_impls.IMPLS if i.name.startswith("cl-")}
TORCH = {i.name: i for i in gn_impls.IMPLS if i.name.startswith("torch")}
THRESHOLD = gn.DEFAULT_THRESHOLD

# Shapes on each side of HxW = 2048, 4-D and 5-D: (small, large)
SHAPES = {
    4: ((2, 8, 5, 7), (1, 4, 32, 64)),          # HxW 35 | 2048
    5: ((2, 6, 3, 4, 5), (1, 4, 8, 16, 16)),    # HxW 60 | 2048
}


@pytest.fixture(scope="module", autouse=True)
def built():
    gn.load()  # build once (or load the cached build) before any timing-sensitive test


def _case(shape, dtype="f32", affine=True, groups=2, dy_format=None, profile="normal", seed=0):
    spec = parse_dtype(dtype)
    fmt = "channels_last" if len(shape) == 4 else "channels_last_3d"
    return Case("groupnorm", shape, spec.dtype, spec.param_dtype, fmt, dy_format, profile=profile, affine=affine,
                groups=groups, seed=seed)


def _split_runner(strategy: str, threads: int, paths: list[str]):
    """dγ/dβ from a backward without dx, dx from one without dγ/dβ: both optional-output paths."""

    def run(case, t):
        out = {}
        x = t.x.detach().requires_grad_(True)
        y = gn.group_norm(x, case.groups, t.weight, t.bias, case.eps, strategy=strategy, threads=threads)
        (out["dx"],) = torch.autograd.grad(y, [x], t.dy)
        paths.append(gn.last_backward_path())
        out["y"] = y.detach()
        if t.weight is not None:
            w, b = t.weight.detach().requires_grad_(True), t.bias.detach().requires_grad_(True)
            y2 = gn.group_norm(t.x.detach(), case.groups, w, b, case.eps, strategy=strategy, threads=threads)
            out["dweight"], out["dbias"] = torch.autograd.grad(y2, [w, b], t.dy)
            paths.append(gn.last_backward_path())
        return out

    return run


def _recording(impl: Impl, paths: list[str]) -> Impl:
    def path(case):
        paths.append(impl.path(case))
        return paths[-1]

    return replace(impl, path=path)


ALL_PATHS = {gn.path_name(s, g, d, dt, nd)
             for s, g, d, dt, nd in itertools.product(("groups", "pixels"), (True, False), (True, False),
                                                      (torch.float32, torch.bfloat16), (4, 5))}


def test_path_coverage_both_sides_of_threshold():
    assert len(ALL_PATHS) == 32
    seen = {"small": set(), "large": set()}
    for nd, (small, large) in SHAPES.items():
        for side, shape in (("small", small), ("large", large)):
            assert (prod(shape[2:]) < THRESHOLD) == (side == "small")
            for strategy, dtype, affine in itertools.product(("groups", "pixels"), ("f32", "mixed-bf16"), (True, False)):
                paths: list[str] = []
                impl = Impl(f"split-{strategy}", "groupnorm", "test", _split_runner(strategy, 2, paths),
                            convention="direct", supports=gn_impls.supports)
                report = compare("groupnorm", impl, _case(shape, dtype, affine))
                assert report.verdict == PASS, report.summary()
                seen[side].update(paths)
            # γ absent and dx not requested: only dβ (bias without weight), checked against a float64 sum
            for strategy, dtype in itertools.product(("groups", "pixels"), (torch.float32, torch.bfloat16)):
                fmt = torch.channels_last if nd == 4 else torch.channels_last_3d
                x = torch.randn(shape, dtype=torch.float64).to(dtype).contiguous(memory_format=fmt)
                dy = torch.randn(shape, dtype=torch.float64).to(dtype)
                bias = torch.zeros(shape[1], requires_grad=True)
                y = gn.group_norm(x, 2, None, bias, strategy=strategy)
                (db,) = torch.autograd.grad(y, [bias], dy)
                seen[side].add(gn.last_backward_path())
                expected = dy.double().sum(dim=[0, *range(2, len(shape))])
                torch.testing.assert_close(db.double(), expected, rtol=1e-5, atol=1e-4)
    for side, got in seen.items():
        assert got == ALL_PATHS, f"{side}: missing {sorted(ALL_PATHS - got)}"


def test_auto_strategy_follows_threshold():
    for small, large in SHAPES.values():
        for shape, want in ((small, "groups"), (large, "pixels")):
            paths: list[str] = []
            assert compare("groupnorm", _recording(OURS["cl-auto-t2"], paths), _case(shape)).verdict == PASS
            assert paths[0].startswith(want + "/")
    # the threshold is a per-call choice
    x = torch.randn(1, 4, 4, 4).contiguous(memory_format=torch.channels_last).requires_grad_()
    gn.group_norm(x, 2, threshold=8).sum().backward()
    assert gn.last_backward_path().startswith("pixels/")


@pytest.mark.parametrize("n, groups, threads", [(1, 1, 1), (1, 1, 2), (1, 2, 2), (2, 1, 3), (1, 4, 3), (3, 1, 2)])
def test_auto_strategy_uses_pixels_when_sets_are_fewer_than_threads(n, groups, threads):
    """Strategy 1 cannot use more threads than (n, g) sets: auto takes "pixels" then."""
    x = torch.randn(n, 4, 4, 4).contiguous(memory_format=torch.channels_last).requires_grad_()
    gn.group_norm(x, groups, threads=threads).sum().backward()
    want = "pixels" if n * groups < threads else "groups"
    assert gn.last_forward_path().split("/")[0] == want
    assert gn.last_backward_path().split("/")[0] == want


def test_torch_paths_observable():
    """torch's channels-last kernel on both sides of its HxW threshold, γ/no γ, mixed/plain, 4-D/5-D."""
    for name in ("torch-cl-t2", "torch-native-cl-t1"):
        paths: list[str] = []
        impl = _recording(TORCH[name], paths)
        for shapes in SHAPES.values():
            for shape, dtype, affine in itertools.product(shapes, ("f32", "mixed-bf16"), (True, False)):
                report = compare("groupnorm", impl, _case(shape, dtype, affine))
                assert report.verdict in (PASS, KNOWN), report.summary()
        want = {"torch:" + p for p in ALL_PATHS if "/dx/" in p}
        assert set(paths) == want, sorted(want - set(paths))


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------
@st.composite
def kernel_cases(draw, dtypes=DTYPE_CHOICES, profiles=tuple(PROFILES)):
    rank = draw(st.sampled_from([4, 5]))
    large = draw(st.booleans())
    d = draw(st.sampled_from([1, 2, 3, 8, 17, 64]))
    g = draw(st.integers(1, 4))
    n = draw(st.integers(1, 3))
    if large:  # HxW >= 2048, few channels
        g, n = min(g, max(1, 8 // d)), 1
        spatial = (32, draw(st.sampled_from([64, 65]))) if rank == 4 else (8, 16, draw(st.sampled_from([16, 17])))
    elif rank == 4:
        spatial = (draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    else:
        spatial = (draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    shape = (n, g * d, *spatial)
    if d * prod(spatial) < 2:
        shape = (n, g * 2, *spatial)
    spec = parse_dtype(draw(st.sampled_from(list(dtypes))))
    fmt = "channels_last" if rank == 4 else "channels_last_3d"
    dy_format = draw(st.sampled_from(formats_for(rank)))
    return Case("groupnorm", shape, spec.dtype, spec.param_dtype, fmt, dy_format,
                profile=draw(st.sampled_from(list(profiles))), eps=draw(st.sampled_from([1e-5, 0.1])),
                affine=draw(st.booleans()), groups=g, seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(kernel_cases(), st.sampled_from(sorted(OURS)))
def test_property_matches_reference(case, name):
    report = compare("groupnorm", OURS[name], case)
    assert report.verdict in OK, report.summary()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(kernel_cases(dtypes=("f32", "mixed-bf16", "f64"), profiles=("offset", "near_constant")),
       st.sampled_from(["cl-groups-t3", "cl-pixels-t3", "cl-auto-t1"]))
def test_property_stable_statistics(case, name):
    """|mean| ≫ std: two-pass statistics stay within budget where E[x²]−E[x]² does not."""
    report = compare("groupnorm", OURS[name], case)
    assert report.verdict in OK, report.summary()


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 8), st.integers(1, 4), st.sampled_from([1, 2, 3]), st.sampled_from(["groups", "pixels"]))
def test_property_thread_count_vs_sets(n, g, threads, strategy):
    """N·G below, at and above the thread count: results do not depend on the threads used."""
    case = _case((n, g * 3, 6, 5), groups=g, seed=n * 10 + g)
    out = {}
    for k in (1, threads):
        t = torch_inputs(case.make_inputs())
        out[k] = differentiate(OPS["groupnorm"], gn_impls.ours(strategy, k), case, t)
        assert compare("groupnorm", OURS[f"cl-{strategy}-t{threads}"], case).verdict == PASS
    for key in ("y", "dx", "dweight", "dbias"):
        torch.testing.assert_close(out[1][key], out[threads][key], rtol=1e-5, atol=1e-6)


def test_dy_in_another_format_is_converted():
    for nd, (small, _large) in SHAPES.items():
        for dy_format in formats_for(nd):
            for name in ("cl-groups-t2", "cl-pixels-t2"):
                report = compare("groupnorm", OURS[name], _case(small, dy_format=dy_format))
                assert report.verdict == PASS, report.summary()


def test_unsupported_cases_are_skips():
    for case in (Case("groupnorm", (2, 4, 3, 3), groups=2),                          # contiguous 4-D
                 Case("groupnorm", (2, 4, 3, 3), x_format="strided", groups=2),
                 Case("groupnorm", (2, 4, 9), groups=2),                             # 3-D
                 Case("groupnorm", (2, 4, 3, 3, 3), groups=2)):
        assert compare("groupnorm", OURS["cl-auto-t1"], case).verdict == SKIP
        assert compare("groupnorm", TORCH["torch-cl-t1"], case).verdict == SKIP
    # contiguous and channels-last at once (C == 1): taken
    assert compare("groupnorm", OURS["cl-auto-t1"], Case("groupnorm", (2, 1, 3, 3), groups=1)).verdict == PASS


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def _cl(*shape, dtype=torch.float32):
    t = torch.randn(*shape, dtype=dtype)
    return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d) \
        if t.dim() in (4, 5) else t


@pytest.mark.parametrize("make, match", [
    (lambda: gn.group_norm(torch.randn(2, 4, 3, 3), 2), "x is contiguous"),
    (lambda: gn.group_norm(torch.randn(2, 4, 9), 2), "3-D"),
    (lambda: gn.group_norm(_cl(2, 6, 3, 3), 4), "C=6 is not divisible by num_groups=4"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3).to(torch.int32), 2), "torch.int32"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3), 2, torch.ones(4, dtype=torch.float64)), "weight has dtype torch.float64"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3, dtype=torch.float16), 2, torch.ones(4, dtype=torch.bfloat16)),
     "weight has dtype torch.bfloat16"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3), 2, torch.ones(5)), r"weight has shape \(5,\)"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3), 2, strategy="rows"), "strategy is 'rows'"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3), 2, threads=0), "threads is 0"),
    (lambda: gn.group_norm(torch.randn(2, 4, 3, 3)[:, :, ::2], 2), "strided"),
    (lambda: gn.group_norm([[1.0]], 1), "x is a list"),
    (lambda: gn.group_norm(_cl(2, 4, 3, 3), 2, [1.0] * 4), "weight is a list"),
    (lambda: gn.backward(_cl(2, 4, 3, 3), _cl(2, 4, 3, 3), torch.zeros(3), torch.ones(3), 2), "N\\*G values"),
    (lambda: gn.backward(_cl(2, 4, 3, 2), _cl(2, 4, 3, 3), torch.zeros(4), torch.ones(4), 2), r"dy is \(2, 4, 3, 2\)"),
])
def test_bad_input_raises_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_threads_restored():
    before = torch.get_num_threads()
    gn.group_norm(_cl(2, 4, 3, 3).requires_grad_(), 2, threads=3).sum().backward()
    assert torch.get_num_threads() == before


def test_autograd_honours_needs_input_grad():
    x = _cl(2, 4, 3, 3)
    w = torch.ones(4, requires_grad=True)
    b = torch.zeros(4)
    y = gn.group_norm(x, 2, w, b)
    (dw,) = torch.autograd.grad(y, [w], torch.randn_like(y))
    assert gn.last_backward_path() == "groups/gamma/nodx/plain/2d"
    assert dw.shape == (4,)


def test_no_compiler_is_one_clear_line(monkeypatch, tmp_path):
    from normcheck.kernels.groupnorm import loader

    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path))  # (nothing built there: a build is needed)
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_compiler", lambda: None)
    with pytest.raises(loader.BuildError, match="needs a C\\+\\+ compiler") as info:
        loader.load()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("strategy", ["groups", "pixels"])
def test_output_rounding_matches_torch(dtype, strategy):
    """The kernel rounds its float results to bf16/f16 on the bits; with γ = 0, y is β rounded, which must be
    exactly torch's rounding (nearest even, ties, overflow to inf, subnormals, NaN)."""
    special = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 65520.0, -65520.0, 3e38, 1e-40,
               6e-8, -2.9e-8, float("inf"), float("-inf"), float("nan"), 0.0, 1.0 / 3]  # no -0.0: 0·(x-μ) + -0 may be +0
    beta = torch.tensor(special + torch.randn(64, dtype=torch.float64).mul(100).tolist(), dtype=torch.float32)
    c = beta.numel()
    x = torch.randn(2, c, 3, 5).to(dtype).contiguous(memory_format=torch.channels_last)
    y, _, _ = gn.forward(x, 1, torch.zeros(c), beta, strategy=strategy)
    want = beta.to(dtype).view(1, c, 1, 1).expand_as(y).contiguous(memory_format=torch.channels_last)
    same = (y.view(torch.int16) == want.view(torch.int16)) | (y.isnan() & want.isnan())  # any NaN payload
    assert bool(same.all()), beta[~same[0, :, 0, 0]].tolist()
