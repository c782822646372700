"""Run every JAX, TensorFlow and torch.compile implementation over its op's default sweep and write what is true:
docs/framework-verdicts.json (per implementation: the verdict counts, the sweep's seconds, and every case that did
not pass: its replay token, verdict, worst ratio and message) and, on stdout, the verdict table of
docs/frameworks.md.

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
from normcheck.cases.tokens import decode_case, encode_case
from normcheck.engine.compare import judge

VERDICTS = ("PASS", "FAIL", "KNOWN", "MISTRUSTED", "SKIP")


def kind(impl) -> str:
    return "compile" if impl.name.startswith("torch-compile") else impl.framework


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("jax", "tf", "compile"), action="append")
    parser.add_argument("--op", action="append")
    parser.add_argument("--out", default="docs/framework-verdicts.json")
    parser.add_argument("--failed-only", action="store_true",
                        help="judge again only the FAIL rows already in --out (after a known issue was recorded: "
                             "a new record never changes another verdict)")
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
            key = f"{op}/{record.name}"
            if args.failed_only:
                if key in results:
                    recheck(impl, results[key])
                    out.write_text(json.dumps(results, indent=1))
                continue
            start = time.perf_counter()
            rows = []
            for case in default_sweep(op, follows=record.follows, formats=record.formats):
                r = judge(case, impl)
                worst = r.worst
                rows.append({"case": encode_case(case), "label": case.label, "verdict": r.verdict,
                             "ratio": None if worst is None else worst.max_ratio, "message": r.summary()[:300]})
            seconds = time.perf_counter() - start
            counts = Counter(r["verdict"] for r in rows)
            results[key] = {"seconds": round(seconds, 1), "counts": dict(counts),
                            "rows_not_passed": [r for r in rows if r["verdict"] != "PASS"]}
            print(f"{op}/{record.name}: {dict(counts)} in {seconds:.0f} s", flush=True)
            out.write_text(json.dumps(results, indent=1))
    print(table(results))


def recheck(impl, result: dict) -> None:
    for row in result["rows_not_passed"]:
        if row["verdict"] == "FAIL":
            r = judge(decode_case(row["case"]), impl)
            result["counts"][row["verdict"]] -= 1
            result["counts"][r.verdict] = result["counts"].get(r.verdict, 0) + 1
            row.update(verdict=r.verdict, ratio=None if r.worst is None else r.worst.max_ratio,
                       message=r.summary()[:300])
    result["counts"] = {v: n for v, n in result["counts"].items() if n}
    print(f"{impl.op}/{impl.name}: {result['counts']} (FAIL rows judged again)", flush=True)


def table(results: dict) -> str:
    """The verdict table: one row per implementation, and the known issues its KNOWN rows name (how many rows)."""
    lines = ["| op | implementation | cases | " + " | ".join(VERDICTS) + " | seconds | KNOWN rows name |",
             "|---|---|---|" + "---|" * len(VERDICTS) + "---|---|"]
    for key, r in results.items():
        op, name = key.split("/")
        counts = r["counts"]
        named = Counter(k for row in r["rows_not_passed"] if row["verdict"] == "KNOWN"
                        for k in row["message"].removeprefix("known issue ").split(": ")[0].split(", "))
        issues = ", ".join(f"`{k}` {n}" for k, n in named.most_common())
        lines.append(f"| {op} | {name} | {sum(counts.values())} | "
                     + " | ".join(str(counts.get(v, 0)) for v in VERDICTS) + f" | {r['seconds']:g} | {issues} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
