"""Hypothesis strategies for Cases: small composable pieces (in the style of array-api-tests).

`cases(op)` draws every field of a Case; narrower strategies are made by fixing arguments, e.g.
`cases("groupnorm", dtypes=["bf16"], profiles=["offset"])`. tests/meta/test_strategies.py checks the
strategies themselves: every draw is a valid Case and the axes are all reachable.
"""
from __future__ import annotations

from math import prod
from types import SimpleNamespace

from hypothesis import strategies as st

from ..numerics.dtypes import DTYPE_CHOICES, parse_dtype
from ..numerics.formats import formats_for
from ..numerics.profiles import PROFILES
from ..ops import get_op
from .case import OP_FIELDS, Case

MAX_NUMEL = 1 << 15  # keeps one example well under 100 ms


@st.composite
def shapes(draw, op: str, ranks=(2, 3, 4, 5), max_numel: int = MAX_NUMEL) -> tuple[int, ...]:
    rank = draw(st.sampled_from(ranks))
    n = draw(st.integers(1, 8))
    c = draw(st.integers(1, 16))
    spatial = draw(st.lists(st.integers(1, 64 if rank == 3 else 24 if rank == 4 else 10),
                            min_size=rank - 2, max_size=rank - 2))
    shape = (n, c, *spatial)
    while prod(shape) > max_numel:  # shrink the largest dim until the case is cheap
        i = max(range(len(shape)), key=lambda k: shape[k])
        shape = shape[:i] + (max(1, shape[i] // 2),) + shape[i + 1:]
    return shape


def _with_enough_per_set(op: str, shape: tuple[int, ...], fields: dict) -> tuple[int, ...]:
    """At least the op's minimum of values per normalisation set (Op.min_set_size): grow a dim every
    set spans (BN: N; GN: C; LN, RMSNorm: the last)."""
    record = get_op(op)
    axis = record.set_dim % len(shape)
    while record.view(SimpleNamespace(shape=shape, **fields)).set_size < record.min_set_size:
        shape = tuple(s + 1 if i == axis else s for i, s in enumerate(shape))
    return shape


@st.composite
def splits(draw, n: int, max_world: int = 8) -> tuple[int, ...]:
    """A per-rank split of n rows over 1..max_world ranks; empty ranks allowed (and likely)."""
    world = draw(st.integers(1, max_world))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=world - 1, max_size=world - 1)))
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@st.composite
def cases(draw, op: str, dtypes=DTYPE_CHOICES, profiles=tuple(PROFILES), ranks=(2, 3, 4, 5),
          max_numel: int = MAX_NUMEL, max_world: int = 8) -> Case:
    shape = draw(shapes(op, [r for r in ranks if r in get_op(op).ranks] or get_op(op).ranks, max_numel))
    spec = parse_dtype(draw(st.sampled_from(list(dtypes))))
    layouts = formats_for(len(shape))
    x_format = draw(st.sampled_from(layouts))
    dy_format = draw(st.one_of(st.just(x_format), st.sampled_from(formats_for(len(shape), "dy"))))
    record = get_op(op)
    fields = dict.fromkeys(OP_FIELDS)
    # enough values per set with the op's own fields at their defaults (one group) or as drawn: before the first
    # field its declaration draws (CaseField.draw) and after each (a set spans K dims: more values, never fewer)
    drawn = {}

    def grown(shape):
        return _with_enough_per_set(op, shape, {**fields, **record.case_fields, "groups": 1, **drawn})

    shape = grown(shape)
    for field in record.fields:
        values = field.candidates(shape, record)
        if values:
            drawn[field.name] = draw(st.sampled_from(values))
            shape = grown(shape)
    fields.update(drawn)
    eps_choices = [1e-5, 1e-3, 0.1] + ([None] if record.eps_none is not None else [])
    affine = draw(st.sampled_from([True, True, False, *record.params]))
    return Case(
        op, shape, spec.dtype, spec.param_dtype, x_format, dy_format,
        profile=draw(st.sampled_from(list(profiles))),
        eps=draw(st.sampled_from(eps_choices)),
        # γ ≈ 0 where the weight is zero-centred (an op with a weight offset): there it is the usual regime
        gamma_scale=draw(st.sampled_from([1.0, 1.0, 1e-3] if "weight_offset" in record.case_fields else [1.0])),
        momentum=draw(st.sampled_from([0.1, 0.5, 1.0])),
        affine=affine,  # each parameter alone too
        **fields, **draw(paths(op, affine)),
        seed=draw(st.integers(0, 2**31 - 1)),
        split=draw(splits(record.layout.extent(shape), max_world)) if record.distributed else None,
    )


@st.composite
def paths(draw, op: str, affine) -> dict:
    """The case's path through the layer (Case.mode, frozen, order): each where the op and `affine` allow it,
    the usual training-mode, nothing-frozen, first-order path about half of the time."""
    record = get_op(op)
    frozen = draw(st.sampled_from(["none", "none", "x", "params"] if affine else ["none"]))
    return {"frozen": frozen,
            "mode": draw(st.sampled_from(["train", "train", "eval"] if record.running_stats else ["train"])),
            "order": draw(st.sampled_from([1, 1, 2, "fwd", "fwd-rev"] if record.double_backward else [1]))}
