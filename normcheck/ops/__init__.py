"""The op catalogue: one record per op (normcheck.ops.core.Op), one line each below.

Adding an op: its reference module (normcheck/reference/), its record module here (with torch's
implementations of it and their known issues), and its line in `_RECORDS`.
"""
from __future__ import annotations

from ..core.errors import UsageError
from . import (adagn, adagn_silu, adaln, add_layernorm, add_rmsnorm, batchnorm, gated_rmsnorm, grouped_rmsnorm, groupnorm,
               groupnorm_silu, instancenorm, layernorm, layernorm_gate, parallel, rmsnorm, scalenorm, syncbn, syncbn_silu)
from . import layernorm_std, rmsnorm_eps_out, rmsnorm_l2, simplenorm
from .core import ALL_CASES, GRADIENTS, Bound, CaseField, Impl, KnownIssue, Op, Operand, Result, Signature
from .design import Design, Exclusion, Factor, Level

RECORDED_WITH_TORCH = "2.13"  # the torch the known issues were recorded (and are reproduced) with

_RECORDS = (
    batchnorm.OP,
    syncbn.OP,
    syncbn_silu.OP,
    groupnorm.OP,
    layernorm.OP,
    rmsnorm.OP,
    instancenorm.OP,
    add_rmsnorm.OP,
    add_layernorm.OP,
    groupnorm_silu.OP,
    adaln.OP,
    grouped_rmsnorm.OP,
    scalenorm.OP,
    gated_rmsnorm.GATE_RMSNORM,
    gated_rmsnorm.RMSNORM_GATE,
    adagn.OP,
    adagn_silu.OP,
    layernorm_gate.OP,
    layernorm_std.OP,
    rmsnorm_eps_out.OP,
    rmsnorm_l2.OP,
    simplenorm.OP,
    parallel.LAYERNORM_SP,
    parallel.RMSNORM_SP,
    parallel.LAYERNORM_HP,
    parallel.RMSNORM_HP,
    parallel.ADD_LAYERNORM_SP,
    parallel.ADD_RMSNORM_SP,
)
OPS: dict[str, Op] = {op.name: op for op in _RECORDS}


def _case_fields() -> dict[str, CaseField]:
    """Every op's own case fields by name (a field several ops take is one declaration, whatever its defaults)."""
    declared: dict[str, CaseField] = {}
    for op in _RECORDS:
        for f in op.fields:
            if not declared.setdefault(f.name, f).same_meaning(f):
                raise ValueError(f"op {op.name}: case field {f.name} is declared otherwise by another op")
    return declared


CASE_FIELDS = _case_fields()


def distributed_ops() -> list[str]:
    """The ops whose cases split over the ranks of a world (what --split, --world-size and --backend apply to)."""
    return [name for name, op in OPS.items() if op.distributed]


PARALLEL_LAYOUTS = tuple(dict.fromkeys(op.layout.name for op in OPS.values() if op.laid_out_from))


def laid_out(op: str, layout: str) -> Op:
    """The parallel op that lays `op` out as `layout` (layernorm, sequence-parallel: layernorm_sp)."""
    found = [o for o in OPS.values() if o.laid_out_from == op and o.layout.name == layout]
    if not found:
        takers = [f"{o.laid_out_from} ({o.name})" for o in OPS.values() if o.laid_out_from and o.layout.name == layout]
        raise UsageError(f"--backend {layout} lays out {', '.join(takers)}, not {op}")
    return found[0]


def get_op(name: str) -> Op:
    if name not in OPS:
        raise UsageError(f"unknown op {name!r}; choose one of {', '.join(OPS)}")
    return OPS[name]


__all__ = ["ALL_CASES", "Bound", "CASE_FIELDS", "CaseField", "GRADIENTS", "Operand", "Result", "Design", "Exclusion", "Factor", "Impl", "KnownIssue", "Level", "OPS", "Op", "RECORDED_WITH_TORCH",
           "Signature", "PARALLEL_LAYOUTS", "distributed_ops", "get_op", "laid_out"]
