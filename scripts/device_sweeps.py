"""Every op's default sweep on one device, for torch's own records and the project's Triton kernels: the part of
scripts/gpu_check.sh that judges torch's CUDA kernels (and runs on any device torch names, `cpu` included).

    python scripts/device_sweeps.py --device cuda --markdown out.md [--ops layernorm,rmsnorm] [--every-record]
    python scripts/device_sweeps.py --device cpu --triton-interpret --ops rmsnorm   # the Triton kernels on a CPU

Prints one line per (op, implementation) and writes a markdown table: cases, PASS / KNOWN / FAIL / SKIP /
MISTRUSTED counts, the worst budget ratio of the cases that passed, seconds, and the first failing cases with their
replay lines. A known issue recorded for torch's CPU kernels does not excuse a failure on another device
(KnownIssue.devices): a FAIL here is torch's device kernel disagreeing with the reference, to look into and record.
Exit status: 0 when nothing failed, 1 when some case failed, 2 when the run could not start.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's normcheck and tests/

from normcheck import OPS, compare, resolve_impl  # noqa: E402
from normcheck.cases.sweep import default_sweep  # noqa: E402
from normcheck.core.errors import UsageError  # noqa: E402
from normcheck.engine import FAIL, PASS  # noqa: E402
from normcheck.outputs.replay import report_replay  # noqa: E402

# The project's Triton kernels (tests/_triton_kernels.py), judged where Triton runs (a GPU, or its interpreter)
TRITON = {"layernorm": "tests._triton_kernels:triton_layer_norm", "rmsnorm": "tests._triton_kernels:triton_rms_norm"}


def judged(ops: list[str], triton: bool, every_record: bool) -> list[tuple[str, str]]:
    """(op, implementation) pairs: every single-process op's torch record (all of its records with `every_record`:
    fp8, native backward, float32 residual...), then the Triton kernels."""
    pairs = [(op, impl.name) for op in ops if not OPS[op].distributed for impl in OPS[op].impls
             if every_record or impl.name == OPS[op].default_impl]
    return pairs + ([(op, spec) for op, spec in TRITON.items() if op in ops] if triton else [])


def sweep_row(op: str, name: str, device: str, triton_interpret: bool, limit: int | None = None) -> dict:
    impl = resolve_impl(op, name, device=device, triton_interpret=triton_interpret and name in TRITON.values())
    start, reports = time.perf_counter(), []
    cases = default_sweep(op, follows=impl.impl.follows, formats=impl.impl.formats, shares=impl.impl.shares)
    for case in sorted(cases, key=lambda c: c.numel)[:limit] if limit else cases:
        reports.append(compare(op, impl, case))
    counts = Counter(r.verdict for r in reports)
    worst = max((t.max_ratio for r in reports if r.verdict == PASS for t in r.tensors), default=0.0)  # (its margin)
    failures = [f"{r.case.label}: {r.summary()}\n  replay: {report_replay(r)}" for r in reports if r.verdict == FAIL]
    return {"op": op, "impl": name, "cases": len(reports), "counts": counts, "worst": worst,
            "seconds": time.perf_counter() - start, "failures": failures}


def markdown(rows: list[dict], device: str) -> str:
    lines = [f"Every op's default sweep on `{device}` (scripts/device_sweeps.py).", "",
             "| op | implementation | cases | PASS | KNOWN | FAIL | SKIP | MISTRUSTED | worst ratio | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["counts"]
        lines.append(f"| {r['op']} | {r['impl']} | {r['cases']} | {c['PASS']} | {c['KNOWN']} | {c['FAIL']} | "
                     f"{c['SKIP']} | {c['MISTRUSTED']} | {r['worst']:.3g} | {r['seconds']:.0f} |")
    for r in (r for r in rows if r["failures"]):
        lines += ["", f"### {r['op']} / {r['impl']}: {len(r['failures'])} failing cases (the first 5)", "", "```",
                  *r["failures"][:5], "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ops", help="comma-separated (default: every single-process op)")
    parser.add_argument("--every-record", action="store_true", help="all of torch's records of each op, not only "
                        "its default one")
    parser.add_argument("--no-triton", action="store_true", help="leave the project's Triton kernels out")
    parser.add_argument("--triton-interpret", action="store_true", help="run the Triton kernels in Triton's interpreter")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table there")
    parser.add_argument("--limit", type=int, metavar="N", help="the N smallest cases of each sweep only (a quick look)")
    args = parser.parse_args(argv)
    ops = args.ops.split(",") if args.ops else list(OPS)
    rows = []
    try:
        unknown = [op for op in ops if op not in OPS]
        if unknown:
            raise UsageError(f"unknown op {unknown[0]!r}; choose from {', '.join(OPS)}")
        for op, name in judged(ops, not args.no_triton, args.every_record):
            row = sweep_row(op, name, args.device, args.triton_interpret, args.limit)
            rows.append(row)
            if args.markdown:  # (after every row: a run cut short by its time limit keeps what it measured)
                Path(args.markdown).write_text(markdown(rows, args.device))
            print(f"{op:14} {name:42} " + " ".join(f"{k} {v}" for k, v in sorted(row["counts"].items()))
                  + f"  worst {row['worst']:.3g}  {row['seconds']:.0f} s", flush=True)
    except UsageError as e:
        print(f"device_sweeps: {e}", file=sys.stderr)
        return 2
    return 1 if any(r["counts"][FAIL] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
