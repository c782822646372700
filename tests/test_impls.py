"""Template over the implementation catalogue (IMPLS) and the mutant catalogue's correct implementations: every
registered implementation, in its own world, and every correct textbook (tests/mutants/), over its op's default
sweep. Correct ones fail no case; the recipes that are wrong by design fail exactly where their design says, and
nowhere else.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from normcheck import IMPLS, OPS, compare, resolve_impl
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep, triple_cases
from normcheck.engine import FAIL, PASS
from normcheck.engine.report import never_checked
from normcheck.impls.frameworks import IMPLS as OTHER_FRAMEWORKS
from tests.mutants import CATALOGUE, bound

# (op, impl) -> (why it fails, the tensors it may fail on (None: any), where it may fail)
WRONG_BY_DESIGN = {
    ("syncbn", "pre15"): ("averages per-rank means over the world size: wrong on uneven splits",
                          None, lambda c: len(set(c.split)) > 1),
    ("syncbn", "inplace-abn"): ("recomputes x from y: y's rounding divided by γ enters dγ at half precision",
                                {"dweight"}, lambda c: c.dtype in ("f16", "bf16")),
}
# (The baseline is left out: judged against itself it passes by construction; tests/test_tolerance.py judges it
# by the formula bound alone.)
# The GroupNorm kernel's records at 1 and 3 threads (2 is between them: tests/test_groupnorm_kernel.py runs it).
# Other frameworks' layers and torch.compile have a template of their own (tests/test_frameworks.py: slices of
# their sweeps; their whole sweeps are docs/frameworks.md's verdict tables). DTensor's records take torch.chunk's
# splits only: tests/test_parallel.py judges them on such splits.
# torch's fp8 output in e4m3 is the same torch code as in e5m2 (a cast to another fp8 dtype): the gate judges it in
# e5m2 here and e4m3 through the textbook's fp8_e4m3 (tests/test_ops.py), both formats in the fp8 calibration.
_ELSEWHERE = ({(i.op, i.name) for i in OTHER_FRAMEWORKS} | {(op, n) for op in IMPLS for n in IMPLS[op] if "dtensor" in n}
              | {("layernorm", "torch-fp8-e4m3"), ("rmsnorm", "torch-fp8-e4m3")})
JUDGED = {op: [name for name in impls if name != "baseline" and not name.endswith("-t2") and (op, name) not in _ELSEWHERE]
          for op, impls in IMPLS.items()}


# The textbook's fp8 output in e5m2 is the same code as in e4m3 (a cast to another fp8 dtype): the gate judges it in
# e4m3, and e5m2 through torch's torch-fp8-e5m2 records over the same sweep and the fp8 calibration (docs/tolerance.md)
TEXTBOOKS_ELSEWHERE = {("layernorm", "fp8_e5m2"), ("rmsnorm", "fp8_e5m2")}
TEXTBOOKS = {op: [name for name in CATALOGUE[op].CORRECT if (op, name) not in TEXTBOOKS_ELSEWHERE] for op in CATALOGUE}


# Who the gate judges on the boundary scans and the class triples as well (the cases that reach a kernel's size and
# dispatch paths, cases.sweep.scan_rows and triple_cases): the first record of each op
# whose record runs a norm kernel of its own (torch's BatchNorm, SyncBN, GroupNorm, LayerNorm, RMSNorm and
# InstanceNorm kernels) or splits a world (the parallel ops), and every tiled textbook (whose sums are split at sizes
# the scans try). The fused ops' records compose those same kernels with element-wise stages; the covering design's
# cases judge them here, and benchmarks/test_scans_speed.py runs every op's default implementation on its scans too.
KERNELS = {"batchnorm", "syncbn", "groupnorm", "layernorm", "rmsnorm", "instancenorm"}
TILED = {"tiled_sums", "dispatched_paths"}
SCANNED = {op: (set(JUDGED.get(op, ())[:1] or [f"textbook {n}" for n in TEXTBOOKS.get(op, ())[:1]])
                if op in KERNELS or OPS[op].distributed else set())
           | {f"textbook {name}" for name in TEXTBOOKS.get(op, ()) if name in TILED} for op in IMPLS}

# The template's two halves: each op's own records (torch's, ours) and its correct textbooks, judged together
HALVES = [(op, half) for op in IMPLS for half, names in (("records", JUDGED.get(op)), ("textbooks", TEXTBOOKS.get(op)))
          if names]


@pytest.mark.parametrize("op, half", HALVES, ids=[f"{op}-{half}" for op, half in HALVES])
def test_default_sweep(op, half):
    """Each implementation on the sweep of the conventions it follows (torch's add + norm with a float32 stream too);
    the records' verdicts and the textbooks' come from one judging of the op (sweep_reports)."""
    reports = sweep_reports(op)
    if half == "records":
        problems = [problem for name in JUDGED[op] for problem in _problems(op, name, reports[name])]
    else:
        problems = []
        for name in TEXTBOOKS[op]:
            rs = reports[f"textbook {name}"]
            problems += [f"{op}/textbook {name}: {r.case.label}: {r.summary()}" for r in rs if r.verdict == FAIL][:3]
            if not any(r.verdict == PASS for r in rs):
                problems.append(f"{op}/textbook {name}: no case passed")
    assert not problems, problems[:8]


_LATEST: dict[str, dict[str, list]] = {}  # the last op judged (its halves run one after the other)


def sweep_reports(op: str) -> dict[str, list]:
    """{implementation: its reports} for the op's records and textbooks, judged side by side: implementations whose
    sweeps have a case share its reference, bounds and baseline, computed once while they are cached."""
    if op not in _LATEST:
        _LATEST.clear()
        impls = {name: resolve_impl(op, name, hints=False) for name in JUDGED.get(op, ())}  # (wrong-by-design fail)
        # (the textbooks run once per case: compositions of torch ops, whose determinism torch's records check)
        textbooks = {f"textbook {name}": replace(b, impl=replace(b.impl, deterministic=False))
                     for name in TEXTBOOKS.get(op, ()) for b in [bound(op, CATALOGUE[op].CORRECT[name])]}
        everyone = {**impls, **textbooks}
        sweeps = {(follows, part): default_sweep(op, follows=follows, narrowing=Narrowing(scans=part))
                  for follows in dict.fromkeys(impl.impl.follows for impl in everyone.values())
                  for part in ("with", "without")}
        having = {key: set(cases) for key, cases in sweeps.items()}
        triples = {follows: set(triple_cases(op, Narrowing().with_fields(follows))) for follows, _ in sweeps}
        reports = {name: [] for name in everyone}
        # (the sweeps of different conventions are often the same cases: each case once, on everyone who has it)
        for case in dict.fromkeys(c for cases in sweeps.values() for c in cases):
            for name, impl in everyone.items():
                scanned = name in SCANNED[op]
                if case in having[impl.impl.follows, "with" if scanned else "without"] and \
                        (scanned or case not in triples[impl.impl.follows]):
                    reports[name].append(compare(op, impl, case))
        _LATEST[op] = reports
    return _LATEST[op]


def _problems(op: str, name: str, reports) -> list[str]:
    """What is wrong with an implementation's verdicts on its op's default sweep ([] when nothing)."""
    if not any(r.verdict == PASS for r in reports):
        return [f"{op}/{name}: no case passed"]
    if never_checked(reports):  # (the sweep's anchors give every output a case with a tight budget)
        return [f"{op}/{name}: its sweep never checked {', '.join(never_checked(reports))}"]
    failing = [r for r in reports if r.verdict == FAIL]
    if (op, name) not in WRONG_BY_DESIGN:
        return [f"{op}/{name}: {r.case.label}: {r.summary()}" for r in failing[:5]]
    _, tensors, where = WRONG_BY_DESIGN[(op, name)]
    if not failing:
        return [f"{op}/{name} is wrong by design but passed its whole default sweep"]
    failed = [(r, {t.name.split("[")[0] for t in r.tensors if t.verdict == FAIL}) for r in failing]
    return [f"{op}/{name}: fails outside its design: {r.summary()}" for r, names in failed
            if not (where(r.case) and (tensors is None or names <= tensors))]
