"""Parallel norms: LayerNorm and RMSNorm with their input sharded over the ranks of a world (ops.layouts).

Records built from the single-process ones (their reference, sets and conventions), distributed, each with a
layout; the reference is always of the whole, unsharded case:

* layernorm_sp, rmsnorm_sp — sequence-parallel: each rank holds its rows of x and dy (uneven and empty shares) and
  the whole γ (and β). Under the `reduces_grads` convention (the default) the function reduces dγ/dβ itself: the
  gradient autograd gives each rank is the full sum over every rank's rows, bit for bit the same on every rank (the
  world names the ranks that differ and by how much). With `--reduces-grads no` each rank's gradient is its own
  partial sum, which the world adds (the framework's reduction, as for SyncBN).
* layernorm_hp, rmsnorm_hp — hidden-parallel: the one normalised (last) dim split; each rank holds every row of its
  slice of x and dy, and its slice of γ and β; the statistics of a row need every rank's part of it; its γ/β
  gradient is its slice of the full one, and y and dx are its slices of theirs.

* add_layernorm_sp, add_rmsnorm_sp — the residual add + norm, sequence-parallel: each rank holds its rows of x, the
  residual, dy and dh, and returns its rows of y and h (the residual stream stays sharded, as Megatron's does).

Contract (every layout): the base op's, with process_group, world_size, offset after eps: fn(input,
normalized_shape, weight, bias, eps, process_group, world_size, offset) -> its share of y (RMSNorm: no bias; add +
norm: the residual after input, (y, h) returned), where normalized_shape is the WHOLE (H,) and offset the rank's
first row (sequence-parallel) or first hidden index (hidden-parallel).
"""
from __future__ import annotations

from dataclasses import replace

from ..core.errors import UsageError
from . import add_layernorm, add_rmsnorm, dtensor, layernorm, rmsnorm
from .core import CaseField, Op
from .design import (DTYPE, LAYOUT, PROFILE, Design, Exclusion, Factor, eps_factor, levels, rank_factor, split_factor,
                     spread)
from .layouts import HIDDEN_PARALLEL, SEQUENCE_PARALLEL, Layout

ARGS = "process_group, world_size, offset"
SHARES = {
    SEQUENCE_PARALLEL.name: "input: this rank's rows of x; weight, bias: the whole γ, β (replicated); offset: its first "
    "row. Under reduces_grads (the default) autograd's dγ, dβ on every rank are the full sums over all ranks' rows, "
    "the same bits on every rank; --reduces-grads no: its rows' partial sums, which the world adds",
    HIDDEN_PARALLEL.name: "input: every row, this rank's slice of the last dim; weight, bias: its slices of γ, β; "
    "normalized_shape: the whole (H,); offset: its slice's first index; returns its slice of y",
}


REDUCES_GRADS = CaseField(
    "reduces_grads", "yes", "whether the function all-reduces the replicated γ/β gradients itself (yes, the "
    "default: every rank's must be the full sum, the same on every rank) or leaves that to the framework (no: each "
    "rank's partial sum, which the world adds)", choices=("yes", "no"), label="reduces-grads={}", quiet="yes",
    meanings={"yes": "all-reduces the replicated γ/β gradients itself",
              "no": "leaves the replicated γ/β gradients' all-reduce to the framework"})

WHY_ONCE = ("a double backward or forward mode across a world is not defined by normcheck yet (the cotangent of a replicated or "
            "sharded γ's gradient needs a convention of its own)")


def _validate(base: Op, layout: Layout):
    def validate(case) -> None:
        base.validate(case)
        if layout.axis == "hidden" and (case.normalized_dims != 1 or case.normalized_at != "trailing"):
            raise UsageError(f"{case.op} splits the one normalised dim, the last: --normalized-dims 1 and "
                             f"--normalized-at trailing only")
    return validate


def _call(base: Op):
    """The base op's call, with the world's arguments after its own."""
    def call(fn, t, case, group, world_size):
        offset = case.rank_offset(group.rank())
        return base.call(lambda *args: fn(*args, group, world_size, offset), t, case)
    return call


# World sizes 1-8: uneven shares, empty ones first, in the middle and last
ROW_SPLIT = split_factor(
    (4,), "one rank: the collectives over a world of one",
    (3, 5), "two uneven ranks",
    (0, 3, 5), "an empty first rank (rank 0 often leads a collective)",
    (2, 0, 6), "an empty rank in the middle",
    (1, 2, 3, 2), "four uneven ranks",
    (5, 3, 0, 1), "an empty rank and a rank of one",
    (1, 0, 2, 1, 1, 2), "six ranks",
    (2, 1, 0, 3, 1, 1, 2, 0), "eight ranks, the last empty",
)
SEQ_HIDDEN = Factor("hidden", levels(
    2, "H = 2: x̂ = ±1",
    7, "a prime below a vector's width",
    64, "a whole number of vectors",
    1025, "one past 1024: a block and a tail",
), read=lambda c: c.shape[-1], usual=2)
HIDDEN_SPLIT = split_factor(
    (16,), "one rank: the whole row",
    (7, 9), "two uneven slices",
    (0, 5, 11), "an empty first slice (rank 0 often leads a collective)",
    (3, 0, 13), "an empty slice in the middle",
    (1, 2, 3, 2), "four uneven slices",
    (257, 256, 0, 512), "long slices: Σx² of a row split over ranks, one empty",
    (1, 0, 2, 1, 1, 2), "six slices",
    (2, 1, 0, 3, 1, 1, 2, 5), "eight slices",
)
HIDDEN_ROWS = Factor("rows", levels(
    1, "one row", 6, "a few rows", 65, "rows past a vector's width: dγ sums over them",
), read=lambda c: c.view.set_count, usual=1)
# (fewer layouts and profiles: every case runs a world; size-1 dims' strides where a shape has them: the
# hidden-parallel rows of one, not the sequence-parallel shapes)
HIDDEN_LAYOUT = LAYOUT.without(*(v for v in LAYOUT.values
                                 if v[0] != v[1] or v[0] not in ("contiguous", "strided", "channels_last",
                                                                 "contiguous_size1")))
SEQUENCE_LAYOUT = HIDDEN_LAYOUT.without(("contiguous_size1", "contiguous_size1"))
SHARED = (DTYPE, PROFILE.without("exact", "sparse_dy", "tiny", "big"), rank_factor((2, 3, 4)))


def _eps(base: Op) -> Factor:
    return eps_factor(*((None,) if base.eps_none else ()), 0.0, 1e-10, 1e-5, 1e-2)


def _sequence_shape(v: dict) -> dict:
    return {"shape": (sum(v["split"]),) + (2, 3)[:v["rank"] - 2] + (v["hidden"],), "normalized_dims": 1}


def _hidden_shape(v: dict) -> dict:
    return {"shape": spread(v["rows"], v["rank"] - 1) + (sum(v["split"]),), "normalized_dims": 1}


def _design(base: Op, layout: Layout) -> Design:
    """The layout's geometry and the shared factors; the base op's factors of its own case fields (add + norm's
    residual stream) carried over, with their exclusions."""
    small = "hidden" if layout is SEQUENCE_PARALLEL else "split"
    zero_var = Exclusion(("eps", small), lambda eps, v: eps != 0 or (v if isinstance(v, int) else sum(v)) > 2,
                         "eps = 0 with rows of 1 or 2 values: zero variance")
    carried = tuple(f for f in base.sweep.factors
                    if f.fields is not None and set(f.fields(f.values[0])) <= set(base.case_fields))
    names = {f.name for f in carried}
    carried_exclusions = tuple(e for e in base.sweep.exclusions if set(e.factors) & names)
    if layout is SEQUENCE_PARALLEL:
        return Design(factors=(ROW_SPLIT, SEQ_HIDDEN, *SHARED, SEQUENCE_LAYOUT, _eps(base), *carried),
                      shape=_sequence_shape,
                      exclusions=(zero_var, *carried_exclusions))
    return Design(factors=(HIDDEN_SPLIT, HIDDEN_ROWS, *SHARED, HIDDEN_LAYOUT, _eps(base), *carried),
                  shape=_hidden_shape,
                  exclusions=carried_exclusions)


def parallel(base: Op, layout: Layout, suffix: str) -> Op:
    """`base` (layernorm, rmsnorm, or add + either) laid out over a world as `layout` says."""
    head, _, tail = base.signature.partition(") -> ")
    stream = "; residual, h: its share, as x's" if base.operands else ""
    signature = f"{head}, {ARGS}) -> {tail.split('  ')[0]}  ({SHARES[layout.name]}{stream})"
    fields = tuple(f for f in base.fields if f.name != "fp8")  # (fp8 output: not laid out over worlds yet)
    torchs = next(i for i in base.impls if i.name == "torch")
    follows = {name: value for name, value in torchs.follows if name != "fp8"}
    kind = "layer_norm" if "bias" in base.params else "rms_norm"
    # DTensor's records are of the plain norms (the add before one is elementwise on either layout)
    impls = () if base.operands else dtensor.records(f"{base.name}_{suffix}", kind, layout.axis, follows,
                                                     torchs.known_issues)
    return replace(
        base, name=f"{base.name}_{suffix}", description=f"{base.description.split(':')[0]}, {layout.name}: "
        f"{layout.description}", signature=signature, call=_call(base), distributed=True, world="gloo",
        layout=layout, laid_out_from=base.name,
        inner=base.inner and f"{base.inner}_{suffix}",  # (a fused op's inner norm, laid out alike)
        fields=fields + ((REDUCES_GRADS,) if layout.reduces_grads else ()),
        validate=_validate(base, layout), sweep=_design(base, layout), double_backward=False,
        why_once_differentiable=WHY_ONCE, array_signature=None, array_call=None,
        extensions=tuple(e for e in base.extensions if e.field != "fp8"), impls=impls,
        default_impl="textbook")


LAYERNORM_SP = parallel(layernorm.OP, SEQUENCE_PARALLEL, "sp")
RMSNORM_SP = parallel(rmsnorm.OP, SEQUENCE_PARALLEL, "sp")
LAYERNORM_HP = parallel(layernorm.OP, HIDDEN_PARALLEL, "hp")
RMSNORM_HP = parallel(rmsnorm.OP, HIDDEN_PARALLEL, "hp")
ADD_LAYERNORM_SP = parallel(add_layernorm.OP, SEQUENCE_PARALLEL, "sp")
ADD_RMSNORM_SP = parallel(add_rmsnorm.OP, SEQUENCE_PARALLEL, "sp")
