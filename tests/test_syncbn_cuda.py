"""normcheck's CUDA SyncBN kernels (normcheck.kernels.syncbn.cuda).

Without a GPU (CI): the library builds with this machine's nvcc and exports every launcher; a
compile error is one line naming the log; the host-side replay of the kernels' index arithmetic
(the very functions the kernels call) reads every element exactly once, for its own channel, on
odd channel counts, tiny and empty sets -- and catches a broken walk; the launchers reject
unsupported dtypes before touching the GPU; registration for the CUDA dispatch key installs and
removes our kernels; the CUDA worlds say "no CUDA device".

With a GPU: every primitive against the CPU primitives (which tests/test_syncbn_primitives.py
holds to the float64 reference) and against torch's own CUDA primitives, over hypothesis cases
(channel counts 1 to 1000, empty input, contiguous / channels_last / channels_last_3d / strided,
f64 / f32 / f16 / bf16, mixed parameters); SyncBN composed from them against the float64
reference; offset data; a tensor past 2**31 elements (64-bit indexing); the recipes' property
suite in the lockstep world on one GPU on our kernels and on torch's; torch's own SyncBatchNorm
Function on our kernels.

Tolerances are those of tests/test_syncbn_primitives.py (norm-wise, per dtype; see there).
"""
from __future__ import annotations

import ctypes
import itertools
import shutil
import subprocess
from math import prod

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from normcheck import Case, UsageError, compare, resolve_impl
from normcheck.engine import FAIL
from normcheck.kernels.syncbn import cpu_primitives

cpu_primitives.register()
from normcheck.kernels.syncbn.cuda import loader, primitives
from normcheck.frameworks.torch import lay_out
from normcheck.reference import batch_norm_backward, batch_norm_forward
from normcheck.cases.strategies import cases
from normcheck.impls import worlds_of
from normcheck.kernels.syncbn.recipes import IMPLS as SYNCBN_RECIPES
from normcheck.frameworks.torch import to_device

RECIPES = {r.name: r for r in SYNCBN_RECIPES}
# the CUDA lockstep worlds -> whose primitives the aten ops dispatch to there
CUDA_BACKENDS = {"lockstep-cuda": "torch", "lockstep-cuda-normcheck": "normcheck"}
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
RTOL = {F64: 1e-12, F32: 1e-5, F16: 2.0**-10, BF16: 2.0**-7}
EPS, MOMENTUM = 1e-5, 0.1
FICTITIOUS_COUNT = 7  # the second rank the primitive tests gather from
ODD_CHANNELS = [1, 3, 7, 33, 65, 129, 1000]

needs_nvcc = pytest.mark.skipif(loader.find_nvcc() is None, reason="nvcc not found")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def lib():
    if loader.find_nvcc() is None and not loader.is_built():
        pytest.skip("nvcc not found")
    return loader.load()


# ================================================================== build (CI: nvcc, no GPU)


@needs_nvcc
def test_library_builds_and_exports_every_launcher():
    path = loader.build()
    assert path.is_file() and path.stat().st_size > 0
    lib = loader.declare(ctypes.CDLL(str(path)))  # raises if any symbol is missing
    assert lib.nc_abi_version() == loader.ABI_VERSION
    if shutil.which("nm"):
        symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
        exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
        assert set(loader.SIGNATURES) <= exported, set(loader.SIGNATURES) - exported
    assert set(loader.LAUNCHERS) == {f"nc_{name}" for name in
                                     ("batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
                                      "batch_norm_backward_reduce", "batch_norm_backward_elemt")}


@needs_nvcc
def test_cache_key_follows_source_flags_and_nvcc(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path))
    first = loader.library_path()
    assert first == loader.library_path() and first.is_relative_to(tmp_path)
    monkeypatch.setattr(loader, "NVCC_FLAGS", [*loader.NVCC_FLAGS, "-lineinfo"])
    assert loader.library_path() != first


@needs_nvcc
def test_compile_error_is_one_line_naming_the_log(monkeypatch, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" int nc_abi_version() { return undeclared_name; }\n')
    monkeypatch.setenv("NORMCHECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "SOURCE", bad)
    with pytest.raises(loader.BuildError) as err:
        loader.build()
    message = str(err.value)
    assert "\n" not in message and "undeclared_name" in message and "build.log" in message
    assert not list((tmp_path / "cache").rglob("*.so")), "a failed build left a library behind"


def test_missing_nvcc_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("NORMCHECK_CUDA_LIB", raising=False)
    monkeypatch.setattr(loader, "FALLBACK_NVCC", ())
    assert loader.find_nvcc() is None
    with pytest.raises(loader.BuildError, match=r"^nvcc not found: [^\n]*$"):
        loader.build()


# ------------------------------------------------- the kernels' index arithmetic, replayed on the host


@settings(max_examples=60)
@given(n=st.integers(0, 40), c=st.sampled_from(ODD_CHANNELS + [2, 64, 256]), s=st.sampled_from([1, 2, 3, 31, 33, 97]),
       sm_count=st.sampled_from([1, 3, 132]))
def test_every_element_is_read_once_for_its_own_channel(lib, n, c, s, sm_count):
    assert lib.nc_check_reduce_coverage(n, c, s, sm_count) == 0, "reduction walk"
    assert lib.nc_check_flat_coverage(n, c, s, sm_count) == 0, "elementwise walk"


@pytest.mark.parametrize("n,c,s", [(100352, 64, 1), (32, 64, 3136), (1 << 20, 3, 1), (4, 1000, 1), (0, 7, 5),
                                   (3, 1, 1 << 16), (1 << 26, 1, 1)])
def test_reduce_plans_fit_the_hardware_limits(lib, n, c, s):
    out = (ctypes.c_int64 * 4)()
    lib.nc_reduce_plan(n, c, s, 132, out)
    grid_x, grid_y, block_x, block_y = out
    assert 1 <= block_x * block_y <= 1024 and block_x <= 64 and 1 <= grid_y <= 65535
    assert grid_x * block_x >= c and (grid_x - 1) * block_x < c  # every channel, no empty tile
    if s > 1:
        assert block_x == 1  # one channel per block: a warp reads consecutive addresses
    ws = lib.nc_reduce_workspace_bytes(0, 0, n, c, s, 132)
    assert ws == (grid_y * c * 16 if grid_y > 1 else 0)  # Welford<float>: mean, m2, int64 count


@needs_nvcc
def test_the_coverage_check_catches_a_walk_that_drops_its_carry(tmp_path):
    """A walk that forgets to carry into the next sample when k wraps: the replay must say so."""
    source = loader.SOURCE.read_text()
    carry = "      k -= s;\n      ++q;\n"
    assert source.count(carry) == 1
    mutant = tmp_path / "mutant.cu"
    mutant.write_text(source.replace(carry, "      k -= s;\n"))
    so = tmp_path / "libmutant.so"
    subprocess.run([loader.find_nvcc(), *loader.NVCC_FLAGS, "-o", str(so), str(mutant)], check=True,
                   capture_output=True)
    bad = loader.declare(ctypes.CDLL(str(so)))
    assert bad.nc_check_reduce_coverage(100, 3, 7, 1) != 0  # 700 values a channel: threads step and wrap
    assert bad.nc_check_reduce_coverage(100, 3, 1, 1) == 0  # s == 1 never wraps: the bug hides there


def test_launchers_reject_unsupported_dtypes_before_touching_the_gpu(lib):
    # (input dtype, parameter dtype): double input with float parameters, half with double.
    for dtype, pdtype in [(1, 0), (2, 1), (9, 9), (0, 3)]:
        code = lib.nc_batch_norm_elemt(dtype, pdtype, None, None, 2, 3, 4, None, None, None, None, 132, 0, None)
        assert code == -1 and lib.nc_error_string(code) == b"unsupported dtype combination"
    assert lib.nc_batch_norm_stats(7, None, 2, 3, 4, EPS, None, None, None, 0, 132, 0, None) == -1
    assert lib.nc_batch_norm_gather_stats_with_counts(0, None, None, 0, None, 2, 3, 0, None, None, 0.1, EPS,
                                                      2, None, None, 0, None) == -1  # half output


# ------------------------------------------------------------------- registration and worlds


def _has_cuda_kernel(op: str) -> bool:
    name = op.split(".")[0]
    qualified = f"aten::{name}" + (f".{op.split('.')[1]}" if "." in op else "")
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CUDA")


def test_register_installs_and_unregister_restores_the_cuda_kernels(lib):
    assert not primitives.is_registered()
    before = {op: _has_cuda_kernel(op) for op in primitives.OPS}
    try:
        primitives.register()
        primitives.register()  # idempotent
        assert all(_has_cuda_kernel(op) for op in primitives.OPS)
        with primitives.using("torch"):
            assert not primitives.is_registered()
            assert {op: _has_cuda_kernel(op) for op in primitives.OPS} == before
        assert primitives.is_registered()  # the block restored our registration
    finally:
        primitives.unregister()
    assert {op: _has_cuda_kernel(op) for op in primitives.OPS} == before
    with pytest.raises(ValueError, match="unknown CUDA primitives provider 'apex'"):
        with primitives.using("apex"):
            pass


def test_wrappers_take_cuda_tensors_only():
    with pytest.raises(RuntimeError, match=r"batch_norm_stats: normcheck's CUDA kernels take CUDA tensors, got cpu"):
        primitives.batch_norm_stats(torch.ones(2, 3), EPS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the error cannot happen")
@pytest.mark.parametrize("backend", list(CUDA_BACKENDS))
def test_cuda_worlds_without_a_gpu_say_no_cuda_device(backend):
    case = Case("syncbn", (4, 3, 5), split=(1, 3))
    with pytest.raises(UsageError, match=rf"^no CUDA device: the {backend} backend needs [^\n]*$"):
        resolve_impl("syncbn", "torch19", backend).runner(case, None)


@pytest.mark.parametrize("fmt,shape", [("contiguous", (3, 4, 5)), ("channels_last", (2, 3, 4, 5)),
                                       ("channels_last_3d", (2, 3, 2, 4, 5)), ("strided", (3, 4, 5, 6))])
def test_to_device_keeps_strides_and_values(fmt, shape):
    t = lay_out(torch.arange(prod(shape), dtype=F64).reshape(shape), fmt)
    moved = to_device(t, torch.device("cpu"))  # on a GPU, the tests below move every layout to cuda
    assert moved.stride() == t.stride() and moved.storage_offset() == t.storage_offset() and torch.equal(moved, t)


# ============================================================================ on a GPU

DTYPES = [(F64, F64), (F32, F32), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32)]


@st.composite
def problems(draw, max_numel=1 << 16):
    """(shape, layout, dtype, parameter dtype, affine, seed): odd channel counts, empty batches."""
    rank = draw(st.sampled_from([2, 3, 4, 5]))
    c = draw(st.sampled_from(ODD_CHANNELS + [2, 16, 64]))
    n = draw(st.integers(0, 9))
    spatial = [draw(st.integers(1, 9)) for _ in range(rank - 2)]
    while n * c * prod(spatial) > max_numel and n > 1:
        n //= 2
    layouts = ["contiguous", "strided"] + (["channels_last"] if rank == 4 else []) + (
        ["channels_last_3d"] if rank == 5 else [])
    dtype, pdtype = draw(st.sampled_from(DTYPES))
    return (n, c, *spatial), draw(st.sampled_from(layouts)), dtype, pdtype, draw(st.booleans()), draw(
        st.integers(0, 2**16))


def _inputs(shape, fmt, dtype, pdtype, affine, seed, offset=0.0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.randn(shape, generator=g, dtype=F64) * 1.5 + offset).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=F64).to(dtype)
    w = (torch.rand(c, generator=g, dtype=F64) + 0.5).to(pdtype) if affine else None
    b = torch.randn(c, generator=g, dtype=F64).to(pdtype) if affine else None
    x, dy = lay_out(x, fmt), lay_out(dy, fmt)
    return [None if t is None else to_device(t, torch.device(device)) for t in (x, dy, w, b)]


def _close(name, got, want, dtype, ctx, scale=None):
    """Norm-wise: max|got - want| / scale <= RTOL[dtype], scale being max|want| unless the caller names the size of
    the terms that were rounded (a sum that cancels is rounded at its terms' size, not at its own); NaN where the
    other has NaN. No output and an empty one are the same answer (torch's CUDA kernels return an empty tensor for
    a gradient not asked for, the CPU kernels None)."""
    if got is None or want is None:
        assert _nothing(got) and _nothing(want), f"{name}: {got} vs {want} {ctx}"
        return
    a = got.detach().cpu().to(F64).numpy()
    e = want.detach().cpu().to(F64).numpy() if isinstance(want, torch.Tensor) else np.asarray(want, np.float64)
    assert a.shape == e.shape, f"{name}: shape {a.shape} vs {e.shape} {ctx}"
    assert np.array_equal(np.isnan(a), np.isnan(e)), f"{name}: NaN in different places {ctx}"
    a, e = np.nan_to_num(a), np.nan_to_num(e)
    if e.size == 0:
        return
    top = max(np.max(np.abs(e)), 0.0 if scale is None else scale)
    err = np.max(np.abs(a - e)) / (top if top > 0 else 1.0)
    assert err <= RTOL[dtype], f"{name}: relative error {err:.3e} > {RTOL[dtype]:.1e} {ctx}"


def _nothing(t):
    return t is None or (t.numel() if isinstance(t, torch.Tensor) else np.size(t)) == 0


def _memory_format(t):
    """channels_last where a 4-D tensor is laid out so (its size-1 dims' strides aside), else contiguous."""
    channels_last = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    return "channels_last" if channels_last else "contiguous"


def _cpu(t):
    return None if t is None else t.detach().cpu()


def _primitive_outputs(x, dy, w, b, counts_world, empty_rank=True):
    """Every primitive once, on whatever device x is on (aten dispatch): a dict of outputs.

    The gather sees x's statistics, a second fictitious rank's and -- with `empty_rank` -- a
    third with count 0 and NaN statistics, which must carry no weight (torch's CUDA kernel would
    spread the NaN: its Python SyncBN filters such ranks out first)."""
    acc = F64 if x.dtype == F64 else F32
    mean, invstd = torch.batch_norm_stats(x, EPS)
    rm = torch.zeros(x.shape[1], dtype=w.dtype if w is not None else acc, device=x.device)
    rv = torch.ones_like(rm)
    ranks = 3 if empty_rank else 2
    mean_all = torch.stack([mean, mean + 0.5, torch.full_like(mean, float("nan"))][:ranks])
    invstd_all = torch.stack([invstd, invstd * 0.5, torch.full_like(invstd, float("nan"))][:ranks])
    counts = torch.tensor([counts_world, FICTITIOUS_COUNT, 0.0][:ranks], dtype=rm.dtype, device=x.device)
    gmean, ginvstd = torch.batch_norm_gather_stats_with_counts(x, mean_all, invstd_all, rm, rv, MOMENTUM, EPS, counts)
    ginvstd = torch.nan_to_num(ginvstd, nan=1.0)  # an all-empty world has no statistics
    y = torch.batch_norm_elemt(x, w, b, gmean, ginvstd, EPS)
    sums = torch.batch_norm_backward_reduce(dy, x, gmean, ginvstd, w, True, w is not None, b is not None)
    count = torch.tensor([max(counts_world, 1), FICTITIOUS_COUNT], dtype=torch.int32, device=x.device)
    dx = torch.batch_norm_backward_elemt(dy, x, gmean, ginvstd, None if w is None else w.to(acc), sums[0], sums[1],
                                         count)
    return {"mean": mean, "invstd": invstd, "gathered mean": gmean, "gathered invstd": ginvstd,
            "running_mean": rm, "running_var": rv, "y": y, "sum_dy": sums[0], "sum_dy_xmu": sums[1],
            "grad_weight": sums[2], "grad_bias": sums[3], "dx": dx}


def _tolerance_dtype(name, x_dtype, w_dtype):
    if name in ("y", "dx"):
        return x_dtype
    if name in ("grad_weight", "grad_bias", "running_mean", "running_var"):
        return w_dtype
    return F64 if x_dtype == F64 else F32  # statistics and sums: the accumulation dtype


def _dx_scale(outputs, x, dy, w, total):
    """The size of the terms dx is made of, |w·invstd|·(|dy| + |mean dy| + |x̂·mean(dy·x̂)|), at its largest: one
    sample against a fictitious rank's statistics cancels them to almost nothing, and both kernels round at this
    size, not at the result's."""
    along_c = [1, x.shape[1]] + [1] * (x.dim() - 2)
    f64 = lambda t: t.detach().cpu().to(F64)  # noqa: E731
    invstd = f64(outputs["gathered invstd"]).view(along_c)
    xhat = (f64(x) - f64(outputs["gathered mean"]).view(along_c)) * invstd
    gain = invstd * (1.0 if w is None else f64(w).abs().view(along_c))
    terms = gain * (f64(dy).abs() + f64(outputs["sum_dy"]).abs().view(along_c) / total
                    + xhat.abs() * (f64(outputs["sum_dy_xmu"]) * invstd.view(-1)).abs().view(along_c) / total)
    return float(terms.max()) if terms.numel() else None


ROUNDED_SUMS = ("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias")  # the parameter gradients are those sums scaled


def _check_against(reference_outputs, ours, x, dy, w, ctx, total, sums_dtype=None):
    """Every output of `ours` against the reference kernel's. `sums_dtype`: the dtype the reference rounds its
    backward sums to, where that is coarser than the accumulation dtype."""
    w_dtype = w.dtype if w is not None else (F64 if x.dtype == F64 else F32)
    for name, want in reference_outputs.items():
        got = ours[name]
        if name in ("mean", "invstd") and x.numel() == 0:  # empty: mean 0, invstd NaN
            assert torch.all(got == 0) if name == "mean" else torch.all(got.isnan()), f"{name} {ctx}"
            continue
        dtype = sums_dtype if sums_dtype is not None and name in ROUNDED_SUMS else _tolerance_dtype(
            name, x.dtype, w_dtype)
        scale = _dx_scale(reference_outputs, x, dy, w, total) if name == "dx" else None
        _close(name, got, want, dtype, ctx, scale)
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
            assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} vs {want.dtype} {ctx}"
    for name in ("y", "dx"):  # the output memory format follows x's (suggest_memory_format); other strides of a
        # non-contiguous x are the allocator's choice (torch's CUDA kernel keeps a transposed 2-D x's, ours do not)
        assert _memory_format(ours[name]) == _memory_format(reference_outputs[name]) or x.numel() == 0, \
            f"{name} memory format {ctx}"


@needs_gpu
@settings(max_examples=150)
@given(problems())
def test_primitives_match_the_cpu_primitives(problem):
    shape, fmt, dtype, pdtype, affine, seed = problem
    x, dy, w, b = _inputs(shape, fmt, dtype, pdtype, affine, seed)
    world = x.numel() // shape[1]
    with primitives.using("normcheck"):
        ours = _primitive_outputs(x, dy, w, b, world)
    theirs = _primitive_outputs(*(_cpu(t) for t in (x, dy, w, b)), world)
    _check_against(theirs, ours, x, dy, w, f"{shape} {fmt} {dtype}/{pdtype} affine={affine}",
                   max(world, 1) + FICTITIOUS_COUNT)


@needs_gpu
@settings(max_examples=100)
@given(problems())
def test_primitives_match_torchs_cuda_primitives(problem):
    shape, fmt, dtype, pdtype, affine, seed = problem
    if shape[0] == 0:
        return  # torch's CUDA primitives reject or differ on empty input; the CPU test covers it
    x, dy, w, b = _inputs(shape, fmt, dtype, pdtype, affine, seed)
    world = x.numel() // shape[1]
    with primitives.using("torch"):
        native = _primitive_outputs(x, dy, w, b, world, empty_rank=False)
    with primitives.using("normcheck"):
        ours = _primitive_outputs(x, dy, w, b, world, empty_rank=False)
    # torch's CUDA kernel may round its backward sums of half-precision x through x's dtype, whatever the weight's
    # (seen on an H200: sum_dy_xmu and grad_weight off by half a float16 ulp without a weight and with a float32
    # one); the CPU test above holds ours to the accumulation dtype
    _check_against(native, ours, x, dy, w, f"{shape} {fmt} {dtype}/{pdtype} affine={affine}",
                   max(world, 1) + FICTITIOUS_COUNT, sums_dtype=dtype if dtype in (F16, BF16) else None)


def _joined(pieces):
    """The ranks' outputs as one batch. An empty piece is left out: torch.cat of channels-last tensors with an empty
    one among them is contiguous, whatever the empty one's strides."""
    return torch.cat([p for p in pieces if p.numel()] or pieces[:1])


def _sync_bn(x, dy, w, b, splits):
    """SyncBN forward + backward from the primitives, ranks = slices of the batch (as
    tests/test_syncbn_primitives.sync_bn, with every tensor on x's device); also the size of the ranks' parameter
    gradients, Σ|rank's part| per channel at its largest, the scale each part was rounded at."""
    dev = x.device
    bounds = list(itertools.pairwise(np.cumsum([0, *splits])))
    xs, dys = [x[lo:hi] for lo, hi in bounds], [dy[lo:hi] for lo, hi in bounds]
    per_rank = [t.numel() // x.shape[1] for t in xs]
    stats = [torch.batch_norm_stats(t, EPS) for t in xs]
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x, torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]), None, None, MOMENTUM, EPS,
        torch.tensor(per_rank, dtype=stats[0][0].dtype, device=dev))
    y = _joined([torch.batch_norm_elemt(t, w, b, mean, invstd, EPS) for t in xs])
    reduced = [torch.batch_norm_backward_reduce(g, t, mean, invstd, w, True, w is not None, b is not None)
               for g, t in zip(dys, xs)]
    sum_dy = torch.stack([r[0] for r in reduced]).sum(0)
    sum_dy_xmu = torch.stack([r[1] for r in reduced]).sum(0)
    count = torch.tensor(per_rank, dtype=torch.int32, device=dev).view(-1, 1)
    w_acc = None if w is None else w.to(mean.dtype)
    dx = _joined([torch.batch_norm_backward_elemt(g, t, mean, invstd, w_acc, sum_dy, sum_dy_xmu, count)
                  for g, t in zip(dys, xs)])
    parts = {"dweight": [r[2] for r in reduced], "dbias": [r[3] for r in reduced]}
    dw = None if w is None else torch.stack(parts["dweight"]).sum(0)
    db = None if b is None else torch.stack(parts["dbias"]).sum(0)
    part_sizes = {name: float(sum(p.detach().cpu().to(F64).abs() for p in ps).max()) for name, ps in parts.items()
                  if ps[0] is not None}
    return y, dx, dw, db, mean, invstd, part_sizes


def _np64(t):
    return None if t is None else t.detach().cpu().to(F64).numpy()


@needs_gpu
@pytest.mark.parametrize("splits", [[9], [3, 0, 4, 2]], ids=["W=1", "W=4-uneven-empty"])
@pytest.mark.parametrize("dtype,pdtype", DTYPES, ids=["f64", "f32", "f16", "bf16", "f16+f32", "bf16+f32"])
@pytest.mark.parametrize("c", ODD_CHANNELS)
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last"])
def test_sync_bn_on_our_kernels_matches_the_float64_reference(fmt, c, dtype, pdtype, splits):
    x, dy, w, b = _inputs((sum(splits), c, 5, 6), fmt, dtype, pdtype, True, seed=c)
    with primitives.using("normcheck"):
        y, dx, dw, db, mean, invstd, part_sizes = _sync_bn(x, dy, w, b, splits)
    fwd = batch_norm_forward(_np64(x), _np64(w), _np64(b), eps=EPS)
    bwd = batch_norm_backward(_np64(dy), _np64(x), _np64(w), EPS, has_bias=True)
    ctx = f"{fmt} C={c} {dtype}/{pdtype} splits={splits}"
    acc = F64 if dtype == F64 else F32
    for name, got, want, tol in [("mean", mean, fwd.mean, acc), ("invstd", invstd, fwd.invstd, acc),
                                 ("y", y, fwd.y, dtype), ("dx", dx, bwd.dx, dtype),
                                 ("dweight", dw, bwd.dweight, pdtype), ("dbias", db, bwd.dbias, pdtype)]:
        # each rank's parameter gradient is rounded to the parameter dtype before the ranks' parts are added
        _close(name, got, want, tol, ctx, part_sizes.get(name))
    if fmt == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last) and dx.is_contiguous(
            memory_format=torch.channels_last)


@needs_gpu
@pytest.mark.parametrize("shape,fmt", [((8, 3, 512, 512), "contiguous"), ((8, 3, 512, 512), "channels_last"),
                                       ((1 << 22, 5), "contiguous"), ((2, 1, 1 << 22), "contiguous")])
def test_large_offset_reductions_keep_float32_accuracy(shape, fmt):
    """~6e6 values per channel at mean 1e4, std 1.5: the variance (not E[x^2] - E[x]^2) to 1e-5,
    the mean to 2 float32 ulps of 1e4; the backward sums to the CPU primitives' float32 accuracy."""
    x, dy, w, b = _inputs(shape, fmt, F32, F32, True, seed=11, offset=1e4)
    with primitives.using("normcheck"):
        mean, invstd = torch.batch_norm_stats(x, 0.0)
        sums = torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True)
    ref = batch_norm_forward(_np64(x), eps=0.0)
    var, ref_var = 1.0 / _np64(invstd) ** 2, 1.0 / ref.invstd**2
    assert np.max(np.abs(var - ref_var) / ref_var) < 1e-5
    assert np.max(np.abs(_np64(mean) - ref.mean)) <= 2 * 2.0**-10
    cpu = cpu_primitives.batch_norm_backward_reduce(dy.cpu(), x.cpu(), mean.cpu(), invstd.cpu(), w.cpu(), True, True,
                                                    True)
    for name, got, want in zip(("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias"), sums, cpu):
        _close(name, got, want, F32, str(shape))


@needs_gpu
def test_tensors_past_two_to_the_31_elements_are_indexed_with_64_bits():
    """x (1, 1, 2**31 + 2**20) in float16: zeros, then ones in the last 2**20 places.  A kernel that
    wraps its index at 2**31 reads zeros there instead: the mean moves and y's tail is wrong."""
    total, tail = (1 << 31) + (1 << 20), 1 << 20
    if torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of GPU memory")
    x = torch.zeros((1, 1, total), dtype=F16, device="cuda")
    x[..., -tail:] = 1
    with primitives.using("normcheck"):
        mean, invstd = torch.batch_norm_stats(x, 0.0)
        p = tail / total
        assert abs(mean.item() - p) < 1e-6 and abs(1 / invstd.item() ** 2 - p * (1 - p)) < 1e-6
        y = torch.batch_norm_elemt(x, None, None, mean, invstd, 0.0)
        assert torch.all(y[..., -tail:] == torch.tensor((1 - p) * invstd.item(), dtype=F16))
        assert torch.all(y[..., :4] == torch.tensor(-p * invstd.item(), dtype=F16))
        del y
        dx = torch.batch_norm_backward_elemt(x, x, mean, invstd, None, mean * 0, mean * 0,
                                             torch.tensor([total], dtype=torch.int32, device="cuda"))
        assert torch.all(dx[..., -tail:] == torch.tensor(invstd.item(), dtype=F16))


# ---------------------------------------------------------------- the property suite on one GPU

CUDA_RECIPES = [name for name, r in RECIPES.items() if "lockstep-cuda-normcheck" in worlds_of(r)]


@needs_gpu
@pytest.mark.parametrize("backend", list(CUDA_BACKENDS))
@pytest.mark.parametrize("name", CUDA_RECIPES)
def test_recipes_agree_with_the_reference_on_one_gpu(name, backend):
    if name == "pre15":
        pytest.skip("pre15 is wrong on uneven splits by design (tests/test_syncbn.py)")
    impl = resolve_impl(RECIPES[name].op, name, backend, 30)
    op = RECIPES[name].op
    dtypes = ("f64", "f32") if name == "inplace-abn" else ("f64", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16")
    calls_before = sum(primitives.CALLS.values())

    @settings(max_examples=30)
    @given(cases(op, dtypes=dtypes, max_world=6, max_numel=1 << 14))
    def check(case):
        report = compare(op, impl, case)
        assert report.verdict != FAIL, f"{report.summary()}\n  backend {backend}"

    check()
    ran_ours = sum(primitives.CALLS.values()) > calls_before
    assert ran_ours == (CUDA_BACKENDS[backend] == "normcheck")


@needs_gpu
def test_torchs_own_syncbn_function_runs_on_our_kernels():
    import torch.distributed as dist
    from torch.nn.modules._functions import SyncBatchNorm

    if not dist.is_nccl_available():
        pytest.skip("torch has no NCCL: no process group for CUDA tensors")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x, dy, w, b = _inputs((6, 7, 5, 4), "channels_last", F32, F32, True, seed=3)
        x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
        rm, rv = torch.zeros(7, device="cuda"), torch.ones(7, device="cuda")
        before = primitives.CALLS["batch_norm_backward_elemt"]
        with primitives.using("normcheck"):
            y = SyncBatchNorm.apply(x, w, b, rm, rv, EPS, MOMENTUM, dist.group.WORLD, 1)
            dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        assert primitives.CALLS["batch_norm_backward_elemt"] == before + 1
        fwd = batch_norm_forward(_np64(x), _np64(w), _np64(b), eps=EPS)
        bwd = batch_norm_backward(_np64(dy), _np64(x), _np64(w), EPS, has_bias=True)
        for name, got, want in [("y", y, fwd.y), ("dx", dx, bwd.dx), ("dweight", dw, bwd.dweight),
                                ("dbias", db, bwd.dbias)]:
            _close(name, got, want, F32, "torch's SyncBatchNorm Function")
    finally:
        dist.destroy_process_group()
