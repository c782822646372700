"""Whether an implementation that fails its first cases computes another op's math.

A layer run as the wrong op (timm's SimpleNorm, x·rsqrt(var(x) + eps)·w, as `--op rmsnorm`) fails every case, and no
convention explains it: hundreds of FAIL rows where one line would do. The ops whose contract takes the same
arguments (Op.contract, of the implementation's kind) and the same parameters, shaped alike, are the ones it may have
been meant for. So once the first PROBE_AFTER cases judged have all failed and no hint explains any of them, each such
op judges those cases again as its own (the same inputs: the common fields, and the op's own fields the other op takes
too), each case until one fails by its values; where at least one passes and none fails by its values (a case that
fails there by its interface alone, a dtype or a shape, says nothing of the math), the run stops with one line naming
the op. Its cost: at most PROBE_AFTER judged cases for each such op, once a run (rmsnorm's: rmsnorm_eps_out,
rmsnorm_l2 and simplenorm, and scalenorm, whose one gain no rmsnorm case passes; groupnorm's groupnorm_silu,
gate_rmsnorm's rmsnorm_gate, layernorm's layernorm_std). A direct implementation (NumPy's: every output from the case
itself) reads the case's op, and is not asked.
"""
from __future__ import annotations

from dataclasses import replace

from ..cases import Case
from ..core.errors import UsageError
from ..core.loading import contract_arguments
from ..frameworks import FRAMEWORKS
from ..ops import OPS, Bound, Op
from .compare import judge
from .hints import passes
from .normalises import first_failures
from .report import FAIL, Report


def another_op(reports: list[Report], bound: Bound) -> str | None:
    """Which other ops' math `bound` computes, once exactly PROBE_AFTER judged reports are in, all failed and none
    carries a hint (so it is asked once a run): the line that says so (None: none, or no case could tell)."""
    judged = first_failures(reports)
    if judged is None or any(r.hint is not None or r.case is None for r in judged) or bound.impl.convention == "direct":
        return None
    op = judged[0].case.record
    quiet = replace(bound, hints=None)  # (a probe is judged as it is, not explained)
    found = {other.name: passed for other in takers(op, FRAMEWORKS.contract(bound.framework))
             if (passed := computes(other, [r.case for r in judged], quiet))}
    if not found:
        return None
    spelled = "; ".join(f"as --op {name}'s, {passed} pass and none fails by its values ({OPS[name].description})"
                        for name, passed in found.items())
    return (f"{bound.name} is not {op.name}: its first {len(judged)} cases failed as {op.name}'s; {spelled}: run it "
            f"with --op {next(iter(found))}")


def takers(op: Op, kind: str) -> list[Op]:
    """The single-process ops other than `op` whose `kind` contract takes the same arguments, and its parameters."""
    arguments = _arguments(op, kind)
    return [other for other in OPS.values() if other is not op and not other.distributed and
            other.params == op.params and arguments is not None and _arguments(other, kind) == arguments]


def computes(other: Op, cases: list[Case], bound: Bound) -> int:
    """The cases, as `other`'s, judged one by one until one fails by its values: how many passed where none did (0
    where one did)."""
    passed = 0
    for case in cases:
        moved = as_op(case, other)
        if moved is None:
            continue
        try:
            report = judge(moved, bound)
        except UsageError:  # (a world that cannot run it: nothing said)
            continue
        if report.verdict == FAIL and any(t.verdict == FAIL for t in report.tensors):  # (the math is not `other`'s)
            return 0
        passed += passes(report)
    return passed


def as_op(case: Case, other: Op) -> Case | None:
    """`case` as `other`'s (its common fields, and its own fields that `other` takes; eps=None as the number it means
    where `other` takes numbers only, as a layer is built with it), None where it is not the same call: an own field
    `other` does not take set otherwise than its op's default (a weight offset, a casting chain), parameters shaped
    otherwise, or a case `other` refuses (sets of one value)."""
    defaults = case.record.case_fields
    own = dict(case.own)
    if any(name not in other.case_fields and value != defaults.get(name) for name, value in own.items()):
        return None
    eps = case.eps_value if case.eps is None and other.eps_none is None else case.eps
    try:
        moved = replace(case, op=other.name, eps=eps,
                        own=tuple((n, v) for n, v in own.items() if n in other.case_fields))
    except UsageError:
        return None
    return moved if moved.view.param_shape == case.view.param_shape else None


def _arguments(op: Op, kind: str):
    """The arguments of `op`'s contract of `kind` (None: it has none)."""
    try:
        return contract_arguments(op.contract(kind)[0])
    except UsageError:
        return None
