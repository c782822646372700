"""How a distributed op's case is laid out over the ranks of a world (Op.layout).

A case's `split` gives each rank's share of one axis of x and dy; the layout says which axis, what each rank
holds of γ and β, and how the ranks' outputs become the outputs compared with the float64 reference of the whole,
unsharded case (worlds.core.assemble). Generic code reads the layout, never the op's name.

* batch             — SyncBN: the rows (dim 0) split; γ, β replicated; each rank's parameter gradient is its local
                      partial sum and the world sums them (what DDP's all-reduce would do after backward).
* sequence-parallel — LayerNorm/RMSNorm with the rows split (uneven and empty shares); γ, β replicated. Under the
                      `reduces_grads` convention (the default) reducing dγ/dβ is the function's job: every rank's
                      gradient must be the full sum, identical on every rank; without it each rank returns its
                      partial sum and the world adds them, as for SyncBN.
* hidden-parallel   — LayerNorm/RMSNorm with the normalised (last) dim split; each rank holds its slice of x, dy, γ
                      and β, and its γ/β gradient is its slice of the full one.
"""
from __future__ import annotations

from dataclasses import dataclass

ROWS, HIDDEN = "rows", "hidden"
REPLICATED, SHARDED = "replicated", "sharded"


@dataclass(frozen=True)
class Layout:
    """`axis`: the axis of x and dy the split divides (ROWS: dim 0; HIDDEN: the last dim, which is then the one
    normalised dim); `params`: REPLICATED (every rank holds all of γ, β) or SHARDED (each its slice of them, along
    the same axis as the hidden dim); `reduces_grads`: the op takes the reduces_grads convention (a replicated
    parameter's gradient is the function's to reduce when the case says so)."""
    name: str
    axis: str
    params: str
    reduces_grads: bool = False
    description: str = ""
    splits_sets: bool = True  # a normalisation set spans the split axis (its statistics merge over ranks)

    def extent(self, shape: tuple[int, ...]) -> int:
        """The length of the split axis of a case of `shape` (what its split must sum to)."""
        return shape[0] if self.axis == ROWS else shape[-1]

    def extent_text(self, shape: tuple[int, ...]) -> str:
        """What a split must sum to, as a message says it: N=8, or H=16 (the hidden size, the last dim)."""
        return f"N={shape[0]}" if self.axis == ROWS else f"H={shape[-1]} (the hidden size, the last dim)"

    def start(self, split: tuple[int, ...], rank: int) -> int:
        """`rank`'s first index along the split axis: the offset its contract passes it."""
        return sum(split[:rank])

    def data_index(self, split: tuple[int, ...], rank: int) -> tuple:
        """The index of `rank`'s share of x and dy (and of every x-shaped output)."""
        start = self.start(split, rank)
        part = slice(start, start + split[rank])
        return (part,) if self.axis == ROWS else (Ellipsis, part)

    def param_index(self, split: tuple[int, ...], rank: int) -> tuple:
        """The index of `rank`'s share of γ and β: all of them, or its slice."""
        if self.params == REPLICATED:
            return (slice(None),)
        start = self.start(split, rank)
        return (slice(start, start + split[rank]),)

    def data_axis(self, ndim: int) -> int:
        """Where the ranks' x-shaped outputs are joined."""
        return 0 if self.axis == ROWS else ndim - 1

    def rank_of(self, split: tuple[int, ...], index: tuple[int, ...]) -> int:
        """The rank holding element `index` of an x-shaped tensor (the first of equal starts: an empty rank holds none)."""
        at = index[0] if self.axis == ROWS else index[-1]
        end = 0
        for rank, size in enumerate(split):
            end += size
            if at < end:
                return rank
        return len(split) - 1

    def reduced_by_function(self, case) -> bool:
        """Every rank returns the full gradient of a replicated parameter (the case's reduces_grads convention)."""
        return self.params == REPLICATED and self.reduces_grads and case.reduces_grads == "yes"


BATCH = Layout("batch", ROWS, REPLICATED, description="the batch rows split; γ, β replicated; the world sums the "
               "ranks' partial parameter gradients")
SEQUENCE_PARALLEL = Layout("sequence-parallel", ROWS, REPLICATED, reduces_grads=True, splits_sets=False,
                           description="the rows split (uneven and empty shares); γ, β replicated; reducing their "
                           "gradients is the function's job under reduces_grads (every rank: the full sum)")
HIDDEN_PARALLEL = Layout("hidden-parallel", HIDDEN, SHARDED,
                         description="the normalised dim split; each rank holds its slice of x, dy, γ and β")
