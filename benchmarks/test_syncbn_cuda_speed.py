"""Speed of normcheck's CUDA SyncBN primitives next to torch's own, against copy bandwidth.

Per shape, dtype and layout, each primitive runs on the same inputs with torch's CUDA kernels and
with ours (CUDA events, median of `REPEATS` after warm-up); the table gives the time, the bytes
the primitive must move (read x [and dy], write y / dx; per-channel vectors ignored) over that
time, ours/torch speed, and our bandwidth as a fraction of a measured device copy
(``dst.copy_(src)`` of 1 GiB: 2 GiB moved).  Targets (issue 5): ours >= 0.9x torch, and >= 70%
of copy bandwidth on the large shapes.  No timing is asserted; the pytest body checks that ours
and torch's agree on every output it times.

    python benchmarks/test_syncbn_cuda_speed.py --markdown out.md    # the table (scripts/gpu_check.sh)
    pytest benchmarks/test_syncbn_cuda_speed.py                      # the agreement check (skips without CUDA)
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from normcheck.kernels.syncbn.cuda import primitives  # noqa: E402

EPS = 1e-5
REPEATS = 20
SHAPES = [(32, 256, 56, 56), (64, 1024, 14, 14), (256, 64, 28, 28), (16, 3, 512, 512), (8192, 1000)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
LARGE_BYTES = 1 << 28  # inputs at least this big count as "large shapes" for the 70% target


def _time_ms(fn, repeats=REPEATS) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _inputs(shape, dtype, layout):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=g).to(dtype)
    dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
    if layout == "channels_last":
        x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w = torch.rand(c, device="cuda") + 0.5
    b = torch.randn(c, device="cuda")
    return x, dy, w, b


def _calls(x, dy, w, b):
    """name -> (callable, bytes it must move) for the four primitives that touch x."""
    mean, invstd = torch.batch_norm_stats(x, EPS)
    sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True)
    count = torch.tensor([x.numel() // x.shape[1]], dtype=torch.int32, device="cuda")
    size = x.numel() * x.element_size()
    return {
        "stats": (lambda: torch.batch_norm_stats(x, EPS), size),
        "elemt": (lambda: torch.batch_norm_elemt(x, w, b, mean, invstd, EPS), 2 * size),
        "backward_reduce": (lambda: torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True),
                            2 * size),
        "backward_elemt": (lambda: torch.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu,
                                                                   count), 3 * size),
    }


def measure(shapes=SHAPES, dtypes=DTYPES, layouts=("contiguous", "channels_last")) -> tuple[float, list[dict]]:
    copy = copy_bandwidth_gbs()
    rows = []
    for shape in shapes:
        for dname, dtype in dtypes.items():
            for layout in layouts:
                if layout == "channels_last" and len(shape) != 4:
                    continue
                x, dy, w, b = _inputs(shape, dtype, layout)
                times = {}
                for provider in ("torch", "normcheck"):
                    with primitives.using(provider):
                        for name, (fn, nbytes) in _calls(x, dy, w, b).items():
                            times[(name, provider)] = (_time_ms(fn), nbytes)
                for name in ("stats", "elemt", "backward_reduce", "backward_elemt"):
                    (t_torch, nbytes), (t_ours, _) = times[(name, "torch")], times[(name, "normcheck")]
                    gbs = nbytes / (t_ours * 1e-3) / 1e9
                    rows.append(dict(shape="x".join(map(str, shape)), dtype=dname, layout=layout, op=name,
                                     torch_ms=t_torch, ours_ms=t_ours, speed=t_torch / t_ours, ours_gbs=gbs,
                                     copy_fraction=gbs / copy, large=x.numel() * x.element_size() >= LARGE_BYTES))
                del x, dy
    return copy, rows


def markdown(copy: float, rows: list[dict]) -> str:
    name = torch.cuda.get_device_name()
    lines = [f"Device: {name}; measured copy bandwidth {copy:.0f} GB/s (dst.copy_(src), 1 GiB).", "",
             "| shape | dtype | layout | primitive | torch ms | ours ms | ours/torch speed | ours GB/s | of copy |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['dtype']} | {r['layout']} | {r['op']} | {r['torch_ms']:.3f} | "
                     f"{r['ours_ms']:.3f} | {r['speed']:.2f}x | {r['ours_gbs']:.0f} | {r['copy_fraction']:.0%} |")
    slow = [r for r in rows if r["speed"] < 0.9]
    large = [r for r in rows if r["large"]]
    below = [r for r in large if r["copy_fraction"] < 0.7]
    lines += ["", f"Speed target (ours >= 0.9x torch): {len(rows) - len(slow)}/{len(rows)} rows meet it"
              + (f"; below: {', '.join(_label(r) for r in slow)}" if slow else "."),
              f"Bandwidth target (large shapes >= 70% of copy): {len(large) - len(below)}/{len(large)} rows meet it"
              + (f"; below: {', '.join(_label(r) for r in below)}" if below else ".")]
    return "\n".join(lines) + "\n"


def _label(r: dict) -> str:
    return f"{r['op']} {r['shape']} {r['dtype']} {r['layout']} ({r['speed']:.2f}x, {r['copy_fraction']:.0%})"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_timed_calls_agree_with_torch(dtype, layout):
    x, dy, w, b = _inputs((16, 64, 28, 28), dtype, layout)
    outputs = {}
    for provider in ("torch", "normcheck"):
        with primitives.using(provider):
            outputs[provider] = {name: fn() for name, (fn, _) in _calls(x, dy, w, b).items()}
    tol = {torch.float32: 1e-5, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    for name, theirs in outputs["torch"].items():
        ours = outputs["normcheck"][name]
        for a, e in zip(ours if isinstance(ours, tuple) else (ours,), theirs if isinstance(theirs, tuple) else (theirs,)):
            if e is None:
                continue
            a, e = a.double(), e.double()
            err = ((a - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()
            # y / dx round to dtype; the statistics and sums are float32
            assert err <= (tol if a.numel() == x.numel() else 1e-5), f"{name}: {err:.2e}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="write the table to this file as well")
    parser.add_argument("--quick", action="store_true", help="two shapes, f32 and bf16 only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device: the benchmark needs a visible GPU", file=sys.stderr)
        return 2
    shapes = SHAPES[:2] if args.quick else SHAPES
    dtypes = {k: DTYPES[k] for k in ("f32", "bf16")} if args.quick else DTYPES
    text = markdown(*measure(shapes, dtypes))
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
