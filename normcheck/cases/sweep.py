"""The default sweep: a small set of cases designed from the classes of error, not from known bugs.

Axes and the bug classes they expose:
  dtype       f64 f32 f16 bf16, and f16/bf16 with f32 parameters: accumulation precision, moments
              stored in low precision, mixed-dtype dispatch
  profile     normal, offset (cancellation), near-constant (var ≈ eps, var = 0), heavy tails,
              exact data, sparse dy: variance formulas, eps handling, dropped or mis-scaled terms
  reduction   small sets (8 elements: biased/unbiased and count errors are 1/M large), large sets
              (8192 elements, GroupNorm HxW = 2048: kernels that switch strategy on size) and huge
              sets (65536 elements: error growth of sums, stagnation, cancellation in long sums)
  layout      contiguous, channels_last, channels_last_3d, strided views, transposed (dense, the last
              dims swapped), a storage offset, an expanded (stride-0) dy, and x and dy in different
              formats: kernels that assume strides
  world split (ops whose batch is split over ranks) uneven splits and empty ranks
  path        which inputs require grad (each parameter alone, x or the parameters frozen), eval mode
              (running statistics), order 2 (the double backward): fast paths and the derivatives of
              the statistics that only these paths take
A GridSweep (single-process ops) has every dtype × profile × reduction combination once, layouts
rotating through them so every (dtype, layout) and (profile, layout) pair appears too (a pairwise
covering design, checked in tests/meta/test_sweep.py). Shape rank follows the layout: 2-D to 5-D
all occur. The op's record gives the shapes per reduction size and rank, and its own fields.
"""
from __future__ import annotations

from ..numerics.formats import FORMAT_RANK, expressible
from ..numerics.profiles import PROFILES
from ..ops import GridSweep, get_op
from .case import Case

SWEEP_DTYPES = (("f64", "f64"), ("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("f16", "f32"), ("bf16", "f32"))
SWEEP_LAYOUTS = (
    ("contiguous", "contiguous"),
    ("channels_last", "channels_last"),
    ("channels_last_3d", "channels_last_3d"),
    ("strided", "strided"),
    ("channels_last", "contiguous"),
    ("contiguous", "channels_last"),
    ("sliced", "expanded"),
    ("transposed", "sliced"),
)
SIZES = ("small", "large", "huge")


def default_sweep(op: str, seed: int = 0, follows=(), formats: tuple[str, ...] | None = None) -> list[Case]:
    """The op's sweep; `follows`: (field, value) pairs an implementation fixes (Impl.follows), set on every case;
    `formats`: the memory formats it can express (Impl.formats): a case in others takes the standard layout."""
    plan = get_op(op).sweep
    cases = grid_sweep(op, plan, seed) if isinstance(plan, GridSweep) else split_sweep(op, seed)
    if formats is not None:
        cases = [c if expressible(formats, c.x_format, c.dy_format)
                 else c.with_(x_format="contiguous", dy_format="contiguous") for c in cases]
    return [c.with_(**dict(follows)) for c in cases] if follows else cases


def grid_sweep(op: str, plan: GridSweep, seed: int = 0) -> list[Case]:
    cases = []
    parameters_only_in_affine = not get_op(op).running_stats  # then a mixed case needs γ and β to be mixed
    for d, (dtype, param_dtype) in enumerate(SWEEP_DTYPES):
        for p, profile in enumerate(PROFILES):
            for s, size in enumerate(SIZES):
                i = len(cases)
                x_format, dy_format = SWEEP_LAYOUTS[(d + 2 * p + s) % len(SWEEP_LAYOUTS)]
                plain = [r for r in (2, 3, 4) if r in plan.shapes[size]]  # what every layout takes (InstanceNorm: no 2-D)
                rank = FORMAT_RANK.get(x_format, FORMAT_RANK.get(dy_format, plain[i % len(plain)]))
                path = grid_path(get_op(op), i)
                if not path["affine"] and parameters_only_in_affine and dtype != param_dtype:
                    path["affine"] = True
                cases.append(Case(op, plan.shapes[size][rank], dtype, param_dtype, x_format, dy_format, profile,
                                  seed=seed, **path, **plan.fields(size, rank), **plan.variants[i % len(plan.variants)]))
    return cases


def requires_grad_paths(op) -> list[tuple]:
    """(affine, frozen) pairs giving every set of gradients the op can be asked for (every output_mask of
    its native backward): all, only the parameters', only dx, and each parameter alone, with dx and without."""
    pairs = [(True, "x"), (True, "params"), (False, "none")]
    if len(op.params) > 1:
        pairs += [(name, frozen) for frozen in ("none", "x") for name in op.params]
    return pairs


def grid_path(op, i: int) -> dict:
    """Case i's path through the layer: every other case the usual one (both parameters, nothing frozen), the
    others rotating through requires_grad_paths; order 2 on every 7th case and eval mode on every 5th (where
    the op has them), so each falls on every dtype and reduction size."""
    pairs = requires_grad_paths(op)
    affine, frozen = pairs[(i // 2) % len(pairs)] if i % 2 else (True, "none")
    path = {"affine": affine, "frozen": frozen}
    if op.double_backward and i % 7 == 3:
        path["order"] = 2
    if op.running_stats and i % 5 == 2:
        path["mode"] = "eval"
    return path


# Every split with every dtype; layouts and profiles rotate through them. The splits are uneven and
# include empty ranks (first, middle, last); 17x19 spatial sizes make per-rank counts (323·n) that
# bf16 or f16 cannot hold exactly, so counts kept in the wrong dtype show.
SYNCBN_SPLITS = ((4,), (3, 5), (2, 0, 6), (0, 3, 5), (1, 2, 3, 2), (5, 3, 0, 1))
SYNCBN_DTYPES = (("f64", "f64"), ("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32"), ("f16", "f32"))
SYNCBN_LAYOUTS = (("contiguous", (3, 17, 19)), ("channels_last", (3, 17, 19)), ("channels_last_3d", (3, 2, 5, 7)),
                  ("strided", (3, 41)), ("channels_last", (3, 5, 7)))
SYNCBN_PROFILES = ("normal", "offset", "near_constant", "heavy_tailed")


def split_sweep(op: str, seed: int = 0) -> list[Case]:
    cases = []
    for s, split in enumerate(SYNCBN_SPLITS):
        for d, (dtype, param_dtype) in enumerate(SYNCBN_DTYPES):
            i = len(cases)
            layout, rest = SYNCBN_LAYOUTS[(s + d) % len(SYNCBN_LAYOUTS)]
            cases.append(Case(op, (sum(split),) + rest, dtype, param_dtype, layout, layout,
                              SYNCBN_PROFILES[i % len(SYNCBN_PROFILES)], seed=seed, split=split, **split_path(i)))
    return cases


def split_path(i: int) -> dict:
    """Case i's path: parameters absent on every 7th case, each alone on two others, x or the parameters frozen
    on every 4th, eval mode on one case of each split (the running statistics: no collective at all)."""
    affine = {6: False, 2: "weight", 4: "bias"}.get(i % 7, True)
    frozen = ("none", "x", "none", "params")[i % 4] if affine is True else "none"
    eval_mode = (i + i // len(SYNCBN_DTYPES)) % 5 == 2  # one case per split, a different dtype each time
    return {"affine": affine, "frozen": frozen, "mode": "eval" if eval_mode else "train"}


def on_path(case: Case, path: dict) -> Case:
    """A sweep case on the path a run asks for (--mode, --frozen, --order); freezing x or the parameters needs
    parameters, so a case without them takes both."""
    if path.get("frozen", "none") != "none" and not case.affine:
        case = case.with_(affine=True)
    return case.with_(**path) if path else case
