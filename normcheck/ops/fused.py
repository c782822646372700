"""Fused ops built from stages: an inner norm's record with element-wise stages around it (reference.stages).

    fused(layernorm.OP, (Scale("scale", ONE_PLUS, ("dscale", "dshift"), shift="shift", broadcast=PER_SAMPLE),),
          name="adaln", ...)

is adaLN: the inner norm's geometry, sweep, conventions and eps, and a reference composed from the stages and the
inner norm's own (reference.stages.staged). The engine composes the same-precision baseline (that reference in the
accumulation precision) and the tolerance (engine.stage_bounds, one bound per stage kind) from them: a new fusion
declares its stages, operands and interface, and no engine code changes.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..numerics.dtypes import quantise, saturate
from ..reference.stages import AFTER, staged
from .core import GRADIENTS, Impl, KnownIssue, Op


def store_of(i):
    """A result rounded to the dtype the case's record declares for it (add + norm's h: the residual stream's; a
    cast's fp8 copy, saturated to the format's range first)."""
    case = i.case

    def store(name: str, a, saturating: bool = False):
        dtype = case.record.output_dtype(case, name)
        return quantise(saturate(a, dtype) if saturating else a, dtype)

    return store


def reference_of(case) -> Callable:
    """The case's reference (case inputs -> outputs): its record's, with the stages its extensions add on this case
    composed around it (fp8 output's quantising cast)."""
    op, added = case.record, case.record.extension_stages(case)
    return staged(op.reference, added, None, store_of) if added else op.reference


def through_stages(issue: KnownIssue, stages: tuple) -> KnownIssue:
    """An inner norm's known issue as the fused record has it: where its signature names an output of the norm that
    a stage computes others from (add + norm's dx: dresidual; a modulation's y: dscale), it names those too; and
    where it names y, every gradient computed from a dy that a stage further out computes from its input (an
    activation's dz·f'(v)): the norm's own (dbias = Σ dz·f'(y)) and those of the stages after the norm inside it (a
    modulation's dshift)."""
    tensors = issue.signature.tensors
    carried = [out for s in stages for inner, outs in s.carries().items() if inner in tensors for out in outs]
    after = [s for s in stages if s.side == AFTER]
    if "y" in tensors and any(s.backward_reads_input for s in after):
        carried += list(GRADIENTS) + [g for i, s in enumerate(after) if any(o.backward_reads_input for o in after[i + 1:])
                                      for g in s.gradients]
    added = tuple(t for t in dict.fromkeys(carried) if t not in tensors)
    return replace(issue, signature=replace(issue.signature, tensors=tensors + added)) if added else issue


def fused(inner: Op, stages: tuple, **changes) -> Op:
    """`inner` with `stages` around it; `changes`: the fused record's own (name, description, contract, operands,
    outputs, implementations, ...). It keeps the inner record's other fields, so each change a stage makes to the
    interface is said here. The implementations' known issues (the inner norm's kernels') reach the outputs the
    stages compute from the ones they name."""
    outputs = changes.get("outputs", inner.outputs)
    declared = {name for s in stages for name in s.operands()}
    missing = declared - {o.name for o in changes.get("operands", inner.operands)}
    if missing:
        raise ValueError(f"op {changes.get('name', inner.name)}: its stages read operands it does not declare: "
                         f"{', '.join(sorted(missing))}")
    impls: tuple[Impl, ...] = changes.pop("impls", inner.impls)
    impls = tuple(replace(i, known_issues=tuple(through_stages(k, stages) for k in i.known_issues)) for i in impls)
    return replace(inner, stages=tuple(stages), inner=inner.name, impls=impls,
                   reference=staged(inner.reference, tuple(stages), outputs, store_of), **changes)
