"""Run every JAX, TensorFlow and torch.compile implementation over its op's default sweep and write what is true:
docs/framework-verdicts.json (one row per case: verdict, worst ratio, message) and, on stdout, the verdict table
of docs/frameworks.md.

    python scripts/framework_verdicts.py [--framework jax|tf|compile] [--op OP] [--out docs/framework-verdicts.json]

(The gate checks a slice of each sweep and reproduces every known issue: tests/test_frameworks*.py.)
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from normcheck import IMPLS, resolve_impl
from normcheck.cases.sweep import default_sweep
from normcheck.cases.tokens import encode_case
from normcheck.engine.compare import judge

VERDICTS = ("PASS", "FAIL", "KNOWN", "MISTRUSTED", "SKIP")


def kind(impl) -> str:
    return "compile" if impl.name.startswith("torch-compile") else impl.framework


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("jax", "tf", "compile"), action="append")
    parser.add_argument("--op", action="append")
    parser.add_argument("--out", default="docs/framework-verdicts.json")
    args = parser.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    for op, impls in IMPLS.items():
        if args.op and op not in args.op:
            continue
        for record in impls.values():
            if kind(record) not in ("jax", "tf", "compile") or (args.framework and kind(record) not in args.framework):
                continue
            impl = resolve_impl(op, record)
            start = time.perf_counter()
            rows = []
            for case in default_sweep(op, follows=impl.follows, formats=impl.formats):
                r = judge(case, impl)
                worst = r.worst
                rows.append({"case": encode_case(case), "label": case.label, "verdict": r.verdict,
                             "ratio": None if worst is None else worst.max_ratio, "message": r.summary()[:300]})
            seconds = time.perf_counter() - start
            counts = Counter(r["verdict"] for r in rows)
            results[f"{op}/{record.name}"] = {"seconds": round(seconds, 1), "counts": dict(counts), "rows": rows}
            print(f"{op}/{record.name}: {dict(counts)} in {seconds:.0f} s", flush=True)
            out.write_text(json.dumps(results, indent=1))
    print("\n| op | implementation | cases | " + " | ".join(VERDICTS) + " | seconds |")
    print("|---|---|---|" + "---|" * len(VERDICTS) + "---|")
    for key, r in results.items():
        op, name = key.split("/")
        counts = r["counts"]
        print(f"| {op} | {name} | {sum(counts.values())} | " + " | ".join(str(counts.get(v, 0)) for v in VERDICTS)
              + f" | {r['seconds']:g} |")


if __name__ == "__main__":
    main()
