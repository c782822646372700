"""Template over the implementation catalogue (IMPLS): every registered implementation, in its own
world, over its op's default sweep. Correct ones fail no case; the recipes that are wrong by design
fail exactly where their design says, and nowhere else.
"""
from __future__ import annotations

import pytest

from normcheck import IMPLS, compare, resolve_impl
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, PASS
from normcheck.engine.report import never_checked
from normcheck.impls.frameworks import IMPLS as OTHER_FRAMEWORKS

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


@pytest.mark.parametrize("op", list(JUDGED))
def test_default_sweep(op):
    impls = {name: resolve_impl(op, name, hints=False) for name in JUDGED[op]}  # (the wrong-by-design ones fail)
    reports = {name: [] for name in impls}
    # each implementation on the sweep of the conventions it follows (torch's add + norm with a float32 stream too)
    for follows in dict.fromkeys(impl.follows for impl in impls.values()):
        sharing = {name: impl for name, impl in impls.items() if impl.follows == follows}
        for case in default_sweep(op, follows=follows):  # case by case: they share its reference and bounds
            for name, impl in sharing.items():
                reports[name].append(compare(op, impl, case))
    problems = [problem for name in impls for problem in _problems(op, name, reports[name])]
    assert not problems, problems[:8]


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
