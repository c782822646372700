"""The default sweep: a small set of cases designed from the classes of error, not from known bugs.

Axes and the bug classes they expose:
  dtype       f64 f32 f16 bf16, and f16/bf16 with f32 parameters: accumulation precision, moments
              stored in low precision, mixed-dtype dispatch
  profile     normal, offset (cancellation), near-constant (var ≈ eps, var = 0), heavy tails,
              exact data, sparse dy: variance formulas, eps handling, dropped or mis-scaled terms
  reduction   small sets (8 elements: biased/unbiased and count errors are 1/M large), large sets
              (8192 elements, GroupNorm HxW = 2048: kernels that switch strategy on size) and huge
              sets (65536 elements: error growth of sums, stagnation, cancellation in long sums)
  layout      contiguous, channels_last, channels_last_3d, strided views, and x and dy in different
              formats: kernels that assume strides
Every dtype × profile × reduction combination appears once; layouts rotate through them so every
(dtype, layout) and (profile, layout) pair appears too (a pairwise covering design, checked in
tests/test_sweep.py). Shape rank follows the layout: 2-D to 5-D all occur.
"""
from __future__ import annotations

from .cases import DISTRIBUTED_OPS, Case
from .profiles import PROFILES

SWEEP_DTYPES = (("f64", "f64"), ("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("f16", "f32"), ("bf16", "f32"))
SWEEP_LAYOUTS = (
    ("contiguous", "contiguous"),
    ("channels_last", "channels_last"),
    ("channels_last_3d", "channels_last_3d"),
    ("strided", "strided"),
    ("channels_last", "contiguous"),
    ("contiguous", "channels_last"),
)

SIZES = ("small", "large", "huge")

# (op, size) -> shape per rank. Sets hold 8, 8192 (GroupNorm: HxW = 2048) and 65536 elements.
_SHAPES = {
    ("batchnorm", "small"): {2: (8, 3), 3: (2, 3, 4), 4: (2, 3, 2, 2), 5: (2, 3, 2, 2, 1)},
    ("batchnorm", "large"): {2: (8192, 3), 3: (16, 3, 512), 4: (8, 3, 32, 32), 5: (4, 3, 8, 16, 16)},
    ("groupnorm", "small"): {2: (3, 48), 3: (3, 6, 4), 4: (2, 6, 2, 2), 5: (2, 6, 2, 2, 1)},
    ("groupnorm", "large"): {2: (2, 16384), 3: (2, 8, 2048), 4: (2, 8, 32, 64), 5: (2, 8, 8, 16, 16)},
    ("batchnorm", "huge"): {2: (65536, 3), 3: (64, 3, 1024), 4: (16, 3, 64, 64), 5: (16, 3, 4, 32, 32)},
    ("groupnorm", "huge"): {2: (2, 131072), 3: (2, 8, 16384), 4: (2, 8, 128, 128), 5: (2, 8, 16, 32, 32)},
}
_GROUPS = {"small": 3, "large": 2, "huge": 2}  # small GN: C/G = 2 (2-D: 16); larger: C/G = 4 (2-D: set/1)
_GROUPS_2D = {"small": 6, "large": 2, "huge": 2}
_RANK_BY_LAYOUT = {"channels_last": 4, "channels_last_3d": 5}


def default_sweep(op: str, seed: int = 0) -> list[Case]:
    if op in DISTRIBUTED_OPS:
        return syncbn_sweep(seed, op)
    cases = []
    for d, (dtype, param_dtype) in enumerate(SWEEP_DTYPES):
        for p, profile in enumerate(PROFILES):
            for s, size in enumerate(SIZES):
                i = len(cases)
                x_format, dy_format = SWEEP_LAYOUTS[(d + 2 * p + s) % len(SWEEP_LAYOUTS)]
                rank = _RANK_BY_LAYOUT.get(x_format, _RANK_BY_LAYOUT.get(dy_format, 2 + i % 3))
                shape = _SHAPES[(op, size)][rank]
                groups = None
                if op == "groupnorm":
                    groups = (_GROUPS_2D if rank == 2 else _GROUPS)[size]
                cases.append(Case(
                    op, shape, dtype, param_dtype, x_format, dy_format, profile,
                    affine=(i % 5 != 4), groups=groups, seed=seed,
                ))
    return cases


# SyncBN: every split with every dtype; layouts and profiles rotate through them. The splits are
# uneven and include empty ranks (first, middle, last); 17x19 spatial sizes make per-rank counts
# (323·n) that bf16 or f16 cannot hold exactly, so counts kept in the wrong dtype show.
SYNCBN_SPLITS = ((4,), (3, 5), (2, 0, 6), (0, 3, 5), (1, 2, 3, 2), (5, 3, 0, 1))
SYNCBN_DTYPES = (("f64", "f64"), ("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32"), ("f16", "f32"))
SYNCBN_LAYOUTS = (("contiguous", (3, 17, 19)), ("channels_last", (3, 17, 19)), ("channels_last_3d", (3, 2, 5, 7)),
                  ("strided", (3, 41)), ("channels_last", (3, 5, 7)))
SYNCBN_PROFILES = ("normal", "offset", "near_constant", "heavy_tailed")


def syncbn_sweep(seed: int = 0, op: str = "syncbn") -> list[Case]:
    cases = []
    for s, split in enumerate(SYNCBN_SPLITS):
        for d, (dtype, param_dtype) in enumerate(SYNCBN_DTYPES):
            i = len(cases)
            layout, rest = SYNCBN_LAYOUTS[(s + d) % len(SYNCBN_LAYOUTS)]
            cases.append(Case(op, (sum(split),) + rest, dtype, param_dtype, layout, layout,
                              SYNCBN_PROFILES[i % len(SYNCBN_PROFILES)], affine=(i % 7 != 6), seed=seed,
                              split=split))
    return cases
