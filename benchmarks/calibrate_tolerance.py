"""Calibrate the tolerance model (docs/tolerance.md): correct implementations must stay ≤ 1 on many
generated cases, every mutant must go above 1 on the default sweep.

    python benchmarks/calibrate_tolerance.py --cases 2000          # ≈ 15 min on 2 cores
    python benchmarks/calibrate_tolerance.py --cases 50 --json out.json
    python benchmarks/calibrate_tolerance.py --order 2 --cases 200  # the second-order bound (K₂)
    python benchmarks/calibrate_tolerance.py --ops layernorm,rmsnorm --fp8 --cases 300  # the fp8 output's budget

With --order 2 every generated case takes the double backward too, and the second-order tensors' ratios
are reported on their own rows ("[2nd order]"). With --fp8 only the records with fp8 output are judged (torch's
and the catalogue's, each in the format it follows; the baseline in both), their y_fp8 and amax on rows of their
own, and only the fp8 mutants' margins are measured.

Correct implementations: the op record's torch implementations (torch-native-backward; a fused op's eager
composites) outside their recorded known issues, the correct ones of its mutant catalogue (CORRECT in
tests/mutants/<op>.py: the textbook styles), each in the conventions it follows, and the baseline judged by the
formula bound alone (judged against itself it would pass trivially). Mutant margins: how many default-sweep cases
each mutant fails, and its smallest and largest failing ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from normcheck import OPS, Case, compare, resolve_impl  # noqa: E402
from normcheck.engine import FAIL  # noqa: E402
from normcheck.numerics.dtypes import DTYPE_CHOICES, FP8_FORMATS  # noqa: E402
from normcheck.cases.strategies import cases  # noqa: E402
from normcheck.cases.sweep import default_sweep  # noqa: E402
from normcheck.engine.tolerance import CONSTANTS, Constants  # noqa: E402
from tests.mutants import CATALOGUE  # noqa: E402

FORMULA_ONLY = Constants(CONSTANTS.growth, CONSTANTS.rounding, baseline_factor=0.0)


def correct_impls(op: str, fp8: bool = False):
    """(label, bound implementation, constants): torch's records of the op, the correct ones of its
    mutant catalogue, and the baseline by the formula alone (fp8: those with fp8 output, the baseline in each format)."""
    named = [(i.name, i) for i in OPS[op].impls] + list(CATALOGUE[op].CORRECT.items())
    if fp8:
        baseline = resolve_impl(op, "baseline")
        return [(label, resolve_impl(op, impl), CONSTANTS) for label, impl in named
                if dict(getattr(impl, "follows", ())).get("fp8")] + [
            (f"baseline {f} (formula only)", replace(baseline, impl=replace(baseline.impl, follows=(("fp8", f),))),
             FORMULA_ONLY) for f in FP8_FORMATS]
    return [(label, resolve_impl(op, impl), CONSTANTS) for label, impl in named
            if not dict(getattr(impl, "follows", ())).get("fp8")] + [
        ("baseline (formula only)", resolve_impl(op, "baseline"), FORMULA_ONLY)]


# Cases where the bound was found too loose or too tight (docs/tolerance.md), judged in every run of their op and
# dtype beside the generated ones: (dtype choice, case). An f64 LayerNorm JVP on offset rows of two (the tangent's
# product, centred or not), adaLN's dscale over 4097 tokens in f16, add + RMSNorm's dγ over 257 rows of one value
# (rstd from the unrounded sum)
PINNED = {
    "layernorm": [("f64", Case("layernorm", (4096, 2), "f64", profile="offset", affine=False, order="fwd",
                               normalized_dims=1, seed=seed)) for seed in (0, 3)],
    "adaln": [("f16", Case("adaln", (2, 4097, 17), "f16", profile="normal", eps=0.0, affine=False))],
    "add_rmsnorm": [("mixed-f16", Case("add_rmsnorm", (1, 1, 1, 257, 1), "f16", "f32", profile="tiny", eps=1e-6,
                                       normalized_dims=1, x_format="channels_last_3d"))],
}
IN_ISSUE_REGION = "[issue region, unnamed tensors]"  # (a row of its own: the cases inside a known issue's region)


def sharing_cases(judged):
    """`judged` ((label, impl, constants) triples) with those that follow the same conventions under the same
    constants next to each other: they judge the same case one after another and share its reference, bounds and
    baseline (engine.compare keeps the last case's)."""
    return sorted(judged, key=lambda j: (repr(j[2]), repr(sorted(j[1].impl.follows))))


def survey(op: str, dtype: str, count: int, order: int = 1) -> dict:
    listed = correct_impls(op)
    ratios = {label: [] for label, _, _ in listed}  # (the table's rows in the records' order)
    known = defaultdict(int)
    failures = []
    judged = sharing_cases(listed)

    def judge(drawn, order):
        for label, impl, constants in judged:
            case = drawn.with_(**dict(impl.impl.follows), order=order)  # in the conventions it follows (RMSNorm's offset, casting)
            if impl.unsupported(case):
                continue  # (once differentiable at order 2)
            issues = [k for k in impl.impl.known_issues if k.applies(case)]
            report = compare(op, impl, case, constants)
            if issues:
                # inside a recorded torch issue's region the tensors its signature names are not evidence either way;
                # the others are (a fused op's own outputs where torch's inner norm sums dγ in half precision)
                known[label] += 1
                named = {name for k in issues for name in k.signature.tensors}
                others = [t for t in report.tensors if t.name.split("[")[0] not in named]
                if any(t.verdict == FAIL for t in others) or (report.verdict == FAIL and not report.tensors):
                    failures.append(f"{label}: {case.label}: {report.summary()}")
                if others:
                    ratios.setdefault(f"{label} {IN_ISSUE_REGION}", []).append(max(t.max_ratio for t in others))
                continue
            if report.verdict == FAIL:
                failures.append(f"{label}: {case.label}: {report.summary()}")
            if report.worst is not None:
                ratios[label].append(report.worst.max_ratio)
            second = [t.max_ratio for t in report.tensors if t.name in case.directional]
            if second:
                ratios.setdefault(f"{label} [2nd order]", []).append(max(second))

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(op, dtypes=[dtype]))
    def run(drawn):
        judge(drawn, order)

    for choice, pinned in PINNED.get(op, ()):
        if choice == dtype:
            judge(pinned, pinned.order)
    run()
    return {
        label: {"cases": len(r), "known": known[label.split(" [")[0]], "max": float(np.max(r)),
                "p99": float(np.percentile(r, 99)), "median": float(np.median(r))}
        for label, r in ratios.items() if r
    } | {"failures": failures}


FP8_TENSORS = ("y_fp8", "amax")


def fp8_survey(op: str, dtype: str, count: int) -> dict:
    """survey() of the records with fp8 output (correct_impls(op, fp8=True)), y_fp8's and amax's ratios on rows of
    their own. Inside a known issue's region of torch's the fp8 tensors, which no issue's signature names, are still
    evidence (the row's other tensors are not)."""
    ratios = defaultdict(list)
    known = defaultdict(int)
    failures = []
    judged = correct_impls(op, fp8=True)

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(op, dtypes=[dtype]))
    def run_fp8(drawn):
        for label, impl, constants in judged:
            case = drawn.with_(**dict(impl.impl.follows))
            if impl.unsupported(case):
                continue
            issue = any(k.applies(case) for k in impl.impl.known_issues)
            known[label] += issue
            report = compare(op, impl, case, constants)
            judged_tensors = [t for t in report.tensors if not issue or t.name in FP8_TENSORS]
            if any(t.verdict == FAIL for t in judged_tensors) or (report.verdict == FAIL and not report.tensors):
                failures.append(f"{label}: {case.label}: {report.summary()}")
            if judged_tensors and not issue:
                ratios[label].append(max(t.max_ratio for t in judged_tensors))
            for t in judged_tensors:
                if t.name in FP8_TENSORS:
                    ratios[f"{label} [{t.name}]"].append(t.max_ratio)

    run_fp8()
    return {
        label: {"cases": len(r), "known": known[label.split(" [")[0]], "max": float(np.max(r)),
                "p99": float(np.percentile(r, 99)), "median": float(np.median(r))}
        for label, r in ratios.items()
    } | {"failures": failures}


def mutant_margins(op: str, fp8: bool = False) -> dict:
    table = CATALOGUE[op].FP8_MUTANTS if fp8 else CATALOGUE[op].MUTANTS
    impls = {name: resolve_impl(op, fn) for name, fn in table.items()}
    reports = defaultdict(list)
    # case by case, every mutant following the sweep's conventions in turn: they share the case's expectations
    for follows in dict.fromkeys(impl.impl.follows for impl in impls.values()):
        for case in default_sweep(op, follows=follows):
            for name, impl in impls.items():
                if impl.impl.follows == follows:
                    reports[name].append(compare(op, impl, case))
    out = {}
    for name in table:
        failing = [r for r in reports[name] if r.verdict == FAIL]
        # a failure with compared tensors has a ratio (its message may name a known issue it resembles)
        ratios = [r.worst.max_ratio for r in failing if r.tensors]
        # the weakest catch: how far above 1 the least failing case is (a margin near 1 is a bug nearly missed)
        out[name] = {"caught_by": len(failing), "of": len(reports[name]),
                     "max_ratio": float(max(ratios)) if ratios else None,
                     "min_ratio": float(min(ratios)) if ratios else None,
                     "interface_failures": sum(not r.tensors for r in failing)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2000, help="generated cases per dtype and op")
    parser.add_argument("--ops", default="batchnorm,groupnorm")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--order", type=int, choices=(1, 2), default=1, help="2: every case with its double backward")
    parser.add_argument("--fp8", action="store_true", help="the records with fp8 output and the fp8 mutants only "
                        "(layernorm, rmsnorm)")
    parser.add_argument("--no-mutants", action="store_true", help="skip the mutants' margins (tests/test_ops.py "
                        "checks that the default sweeps catch them)")
    args = parser.parse_args()
    results = {}
    for op in args.ops.split(","):
        start = time.perf_counter()
        survey_of = (lambda d: fp8_survey(op, d, args.cases)) if args.fp8 else (lambda d: survey(op, d, args.cases,
                                                                                                    args.order))
        results[op] = {"correct": {d: survey_of(d) for d in DTYPE_CHOICES},
                       "mutants": {} if args.no_mutants else mutant_margins(op, args.fp8)}
        print(f"## {op}  ({time.perf_counter() - start:.0f} s, constants {CONSTANTS})\n")
        print("| dtype | implementation | cases judged | in a known-issue region | median | p99 | max |")
        print("|---|---|---|---|---|---|---|")
        for d, res in results[op]["correct"].items():
            for label, s in res.items():
                if label != "failures":
                    print(f"| {d} | {label} | {s['cases']} | {s['known']} | {s['median']:.3g} | {s['p99']:.3g} | {s['max']:.3g} |")
        fails = [f for res in results[op]["correct"].values() for f in res["failures"]]
        print(f"\ncorrect implementations failing: {len(fails)}")
        for f in fails[:20]:
            print("  -", f)
        print("\n| mutant | caught by (default sweep) | smallest failing ratio | max ratio |")
        print("|---|---|---|---|")
        for name, m in results[op]["mutants"].items():
            ratios = ("interface failure",) * 2 if m["max_ratio"] is None else (
                f"{m['min_ratio']:.3g}", f"{m['max_ratio']:.3g}")
            print(f"| {name} | {m['caught_by']}/{m['of']} | {ratios[0]} | {ratios[1]} |")
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
