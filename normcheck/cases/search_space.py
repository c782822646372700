"""What a budgeted search draws (engine.search): fresh cases over an op's design, sizes off its levels.

The default sweep is a finite list: a kernel can pass it by accident, or be tuned to it. The search draws from the
same factors (ops.design) under the same narrowing (the run's options, the implementation's limits), but each size
factor (rows, hidden size, channels, ...) takes any size kernels tile on, n = k·2^j + d: k odd from 1 to 31 (the small
ones likelier), d = −1, 0 or +1 (0 likeliest), and now and then a plain integer; every other factor one of its
levels, in fresh combinations, with the case's seed drawn too. Each draw lists the usual level first (and k = 1, d = 0,
the plain integer last), so hypothesis shrinks a failing case toward the usual one and its sizes toward the smallest
that still fail. hypothesis is imported when a strategy is built: normcheck runs without it until a search is asked for.
"""
from __future__ import annotations

from math import prod

from ..ops import Op
from ..core.errors import UsageError
from ..numerics.formats import expressible
from ..ops.design import scan_of
from .narrowing import Narrowing, fits
from .sweep import admits, case_of, geometry_first, narrowed_design, on_record

MAX_ELEMENTS = 1 << 16  # a drawn case's elements at most (the sweep's scans' bound): each is judged in milliseconds
ODD_MULTIPLES = tuple(range(1, 32, 2))
# k weighted about 1/√k, as a table drawn uniformly (hypothesis shrinks an index toward 0, so toward k = 1): k = 1 or 3
# in 30% of the draws, 11 or 13 (2816 = 11·256 tiles) in 11%
K_TABLE = tuple(k for k in ODD_MULTIPLES for _ in range(round(16 / k ** 0.5)))
D_TABLE = (0, 0, -1, 1)  # on the multiple, the size just below it, just past it
PLAIN_ONE_IN = 8  # one size in this many is a plain integer in range


def tile_sizes(low: int = 1, high: int = MAX_ELEMENTS):
    """A strategy of sizes from `low` to `high`, rich in k·2^j − 1, k·2^j and k·2^j + 1 (k odd, 1 to 31)."""
    from hypothesis import strategies as st

    @st.composite
    def draw_size(draw) -> int:
        if draw(st.integers(0, PLAIN_ONE_IN - 1)) == PLAIN_ONE_IN - 1:
            return draw(st.integers(low, high))
        k = draw(st.sampled_from(K_TABLE))
        j = draw(st.integers(0, max(0, (max(high, 1) // k).bit_length() - 1)))  # k·2^j <= high where it can be
        return min(max(k * 2 ** j + draw(st.sampled_from(D_TABLE)), low), high)

    return draw_size()


@on_record
def search_cases(op: Op, narrowing: Narrowing = Narrowing(), formats: tuple[str, ...] | None = None, shares=None,
                 max_elements: int = MAX_ELEMENTS):
    """A strategy of the op's cases under `narrowing` (every level the design keeps, a size factor any size up to the
    element bound), each valid and admitted by the narrowing's limits (sweep.admits); `formats` and `shares`: the
    layouts and the split an implementation expresses (Impl.formats, Impl.shares), as for the default sweep."""
    from hypothesis import assume, strategies as st

    fs, excluded = narrowed_design(op, narrowing)
    sizes = [f for f in fs if scan_of(f) is not None]
    others = [f for f in geometry_first(op, fs) if scan_of(f) is None]
    limit = int(max_elements * (narrowing.element_scale or 1))
    fixed_shape = "shape" in narrowing.fixed  # (its sizes are the run's: what the draws give is overridden)

    def levels(f):
        values = [f.values[f.usual]] + [v for v in f.values if v != f.values[f.usual]]
        if f.name == "layout" and formats is not None:
            values = [v for v in values if expressible(formats, *v)] or [("contiguous", "contiguous")]
        return values

    def drawn_size(draw, f, room: int) -> dict:
        """The row values of one size factor: a size within `room` elements and its scan's limit; where its scan
        reads the size through other values (a split's rank-0 share, G groups of two channels), one of its levels or
        such a size."""
        scan = scan_of(f)
        low = smallest(f)
        high = max(low, min(room, scan.limit if scan.limit is not None else room))
        if scan.values is None:
            return {f.name: draw(tile_sizes(low, high))}
        if draw(st.booleans()):
            return {f.name: draw(st.sampled_from(levels(f)))}
        return scan.values(draw(tile_sizes(low, high)), f.values[f.usual])

    @st.composite
    def draw_case(draw):
        row: dict = {}
        for f in draw(st.permutations(sizes)):  # (in any order: the first drawn is not always the largest)
            room = max(1, limit // max(1, prod(v for v in row.values() if type(v) is int)))
            values = drawn_size(draw, f, room)
            row.update(values)
            assume(all(fits(excluded, {k: v for k, v in row.items() if k != name}, name, value)
                       for name, value in values.items()))
        for f in others:
            values = levels(f)
            fitting = [v for v in values if fits(excluded, row, f.name, v)]
            assume(fitting)
            # (one draw over all its levels whatever fits: a factor left one level by another's value still takes a
            # choice, or hypothesis would rank that shorter draw as simpler: 1x1x1x88 channels_last over 1x88)
            value = values[draw(st.integers(0, len(values) - 1))] if len(values) > 1 else values[0]
            row[f.name] = value if value in fitting else fitting[0]
        try:
            case = narrowing.apply(case_of(op, row, draw(st.integers(0, 2**31 - 1)), narrowing))
        except UsageError:  # (sizes that make no case of this op: too few values per set, ...)
            case = None
        assume(case is not None and (fixed_shape or case.numel <= limit))
        if shares is not None:
            case = case.with_(split=shares(case.record.layout.extent(case.shape), len(case.split)))
        assume(admits(op, case, narrowing))
        return case

    return draw_case()


def smallest(f) -> int:
    """The smallest size of a size factor: its smallest integer level; where its levels are labels or splits, 1, or
    the smallest rank-0 share (0: an empty rank)."""
    ints = [v for v in f.values if type(v) is int]
    shares = [v[0] for v in f.values if isinstance(v, tuple) and v]
    return min(ints or shares or [1])
