"""Sweeps as designs over declared factors: the record types, and the vocabulary every op shares.

A `Factor` is one thing kernels dispatch on (rows, hidden size, channels, groups, eps, a dtype, a layout,
a path through the layer), with the `Level`s that sit on its dispatch boundaries, each with a one-line
why. An op's `Design` lists its own factors (its geometry, eps, momentum, ...) and how their values make a
shape; the shared factors below (dtype, layout, value profile, rank, the path) come from the op's record
(its ranks, parameters, modes, orders), and an op's own factor of the same name replaces a shared one.
`Exclusion`s are the pairs of values that cannot meet (a layout that needs a rank, eps = 0 with a set of
zero variance, a case too large for a second): normcheck.cases.sweep covers every other pair.

Every factor reads its value back off a built case (`read`), so coverage is measured on the cases the
sweep makes, never taken from the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from math import prod
from typing import Any, Callable

from ..numerics.formats import CHANNELS_LAST, FORMAT_RANK, NON_DENSE, OFFSET_BYTES, base_format

Case = Any  # cases.Case (a layer above: records only read its fields)


@dataclass(frozen=True)
class Level:
    value: Any
    why: str


@dataclass(frozen=True)
class Factor:
    """`read(case)`: the value a case has; `fields(value)`: the case fields a value sets (None: a geometry
    factor, which the op's `Design.shape` turns into a shape with the others); `show(value)`: its label;
    `usual`: the index of the level that fills a case where the design leaves the factor free (the common
    value, not an edge: otherwise most cases would have one row, or eps = 0); `field`: the case field a geometry
    factor's value decides (groups, normalized_dims): a run that fixes that field fixes the factor; `scan`: the
    sizes its boundary scan tries (None: scan_of's rule)."""
    name: str
    levels: tuple[Level, ...]
    read: Callable[[Case], Any]
    fields: Callable[[Any], dict] | None = None
    show: Callable[[Any], str] = str
    usual: int = 0
    field: str | None = None
    scan: "Scan | None" = None  # its boundary scan; None: the shared rule's (scan_of)

    def __post_init__(self):
        values = [lv.value for lv in self.levels]
        if not values or len(set(map(repr, values))) != len(values):
            raise ValueError(f"factor {self.name}: levels must be given, each once")
        if not 0 <= self.usual < len(values):
            raise ValueError(f"factor {self.name}: its usual level must be one of its levels")

    def without(self, *values) -> "Factor":
        """The factor without those values (an op for which they make no sense), its usual level kept."""
        kept = tuple(lv for lv in self.levels if lv.value not in values)
        usual = self.values[self.usual]
        return replace(self, levels=kept, usual=next((i for i, lv in enumerate(kept) if lv.value == usual), 0))

    @cached_property  # (read in every fit of every row a sweep builds)
    def values(self) -> tuple:
        return tuple(lv.value for lv in self.levels)


# ----------------------------------------------------------------------------- boundary scans
# Pairs treat sizes as categories; a tiled kernel's paths change at exact multiples of the widths it splits a size
# by (vector lanes, warps, blocks, row tiles: powers of two, and odd multiples of them: 3-wide vectors, 96-row tiles,
# planes tiled in 160s, size tables' entries for 640, 1280, 5120 or 896, 3584, 7168 values) and one either side (a
# tile that divides the size leaves a zero-width tail, one past it a tail of one). A bug there shows on any dtype
# and layout: a scan tries every such size of one factor, the others at their usual levels.
SCAN_MULTIPLES = (1, 3, 5, 7)
SCAN_DTYPES = (("f64", "f64"), ("f32", "f32"))
# A size only the odd multiples 5 and 7 make is scanned in the last of the scan's dtypes alone (f32: the dtype size
# tables are written for; a tile's wrong math shows there too): a third of the scans' cases fewer
BOTH_DTYPES_MULTIPLES = (1, 3)
SCAN_LAYOUT = ("contiguous", "contiguous")
SCAN_PROFILE = "normal"
SCAN_ELEMENTS = 1 << 16  # a scan case's elements at most: hundreds of sizes cost seconds


@dataclass(frozen=True)
class Scan:
    """A size factor's boundary scan: each size of `boundary_sizes` from the factor's smallest level up to `limit`
    (None: its largest level) is one case. `values(n, usual)`: the row values that give size n, given the factor's
    usual value (default {factor: n}); `read(case)`: the size a built case has (default the factor's read)."""
    limit: int | None = None
    values: Callable[[int, Any], dict] | None = None
    read: Callable[[Case], int] | None = None


NO_SCAN = Scan(limit=0)


def boundary_sizes(limit: int, start: int = 1, multiples: tuple[int, ...] = SCAN_MULTIPLES) -> tuple[int, ...]:
    """Every k·2^j − 1, k·2^j and k·2^j + 1 (k in `multiples`, j >= 1) for k·2^j up to `limit`, from `start`."""
    sizes = {start}
    for k in multiples:
        width = 2 * k
        while width <= limit:
            sizes |= {width - 1, width, width + 1}
            width *= 2
    return tuple(sorted(n for n in sizes if n >= start))


def scanned_in_every_dtype(n: int) -> bool:
    """Size n is a boundary size of the multiples scanned in every dtype (BOTH_DTYPES_MULTIPLES)."""
    return n in boundary_sizes(n + 1, multiples=BOTH_DTYPES_MULTIPLES)


def scan_of(f: Factor) -> Scan | None:
    """A factor's scan: its own declaration, else the shared rule's for a size (a geometry factor of integer levels
    that no case field decides: rows, hidden, set, channels, spatial, batch, sequence); None for anything else."""
    if f.scan is not None:
        return f.scan if f.scan.limit != 0 else None
    sizes = f.fields is None and f.field is None and all(type(v) is int for v in f.values)
    return Scan() if sizes else None


def scan_sizes(f: Factor) -> tuple[int, ...]:
    scan = scan_of(f)
    if scan is None:
        return ()
    ints = [v for v in f.values if type(v) is int]
    start = min(ints, default=1)
    return boundary_sizes(scan.limit if scan.limit is not None else max(ints, default=0), max(start, 0))


@dataclass(frozen=True)
class Exclusion:
    """Values of two factors that cannot meet in one case: `allowed(a, b)` False for them, and why. `elements`: the
    largest product of the two values (at_most), which a world that runs cases slowly scales down (`scaled`)."""
    factors: tuple[str, str]
    allowed: Callable[[Any, Any], bool]
    why: str
    elements: int | None = None

    def scaled(self, scale: float) -> "Exclusion":
        """An element bound `scale` times as large (this exclusion unchanged when it bounds no product)."""
        if self.elements is None:
            return self
        return at_most(max(1, int(self.elements * scale)), *self.factors, f"{self.why} (scaled by {scale:g})")


@dataclass(frozen=True)
class Design:
    """An op's own factors; `shape(row)`: a case's {factor: value} -> the case fields its geometry makes
    ({"shape": ..., and op fields such as groups}); `exclusions`: pairs of values that cannot meet."""
    factors: tuple[Factor, ...]
    shape: Callable[[dict], dict]
    exclusions: tuple[Exclusion, ...] = ()


def levels(*pairs) -> tuple[Level, ...]:
    """levels(value, why, value, why, ...)."""
    return tuple(Level(v, why) for v, why in zip(pairs[::2], pairs[1::2]))


def joined(value) -> str:
    return "/".join(map(str, value)) if isinstance(value, tuple) else str(value)


def spread(total: int, dims: int) -> tuple[int, ...]:
    """`total` as `dims` sizes whose product it is, as even as its divisors allow, largest last
    (2048 over 3 dims: 8x16x16; a prime: 1x...x p; 0: 0x1x...x1)."""
    if total == 0:
        return (0,) + (1,) * (dims - 1)
    sizes = []
    for d in range(dims, 1, -1):
        target = total ** (1 / d)
        divisors = {k for i in range(1, int(total ** 0.5) + 1) if total % i == 0 for k in (i, total // i)}
        size = min(divisors, key=lambda k: (abs(k - target), k))
        sizes.append(size)
        total //= size
    return tuple(sorted(sizes + [total]))


# ----------------------------------------------------------------------------- the shared factors
DTYPE = Factor("dtype", levels(
    ("f64", "f64"), "float64 kernels: the reference's own precision, where only wrong math shows",
    ("f32", "f32"), "float32 accumulation and moments",
    ("f16", "f16"), "half storage: sums and intermediates that must not stay in f16 (overflow past 65504)",
    ("bf16", "bf16"), "bfloat16 storage: 8 significant bits, sums that must be kept in f32",
    ("f16", "f32"), "mixed precision: f16 input with f32 parameters, a dispatch of its own",
    ("bf16", "f32"), "mixed precision: bf16 input with f32 parameters",
), read=lambda c: (c.dtype, c.param_dtype), fields=lambda v: {"dtype": v[0], "param_dtype": v[1]}, show=joined)

LAYOUT = Factor("layout", levels(
    ("contiguous", "contiguous"), "the standard layout",
    ("channels_last", "channels_last"), "NHWC: channel loops innermost, the vectorised path",
    ("channels_last_3d", "channels_last_3d"), "NDHWC",
    ("strided", "strided"), "a non-dense view: kernels that assume density",
    ("channels_last", "contiguous"), "x and dy in different formats: kernels that read dy with x's strides",
    ("contiguous", "channels_last"), "the other way round",
    ("sliced", "expanded"), "x at a storage offset; dy with stride 0 along the batch (y.sum()'s gradient)",
    ("transposed", "sliced"), "x dense with its last two dims swapped; dy at a storage offset",
    ("pitched", "offset8"), "x's rows at a pitch (a slice of a fused projection); dy 8 bytes past a 16-byte boundary: "
                            "a row stride taken as the row length, a vector width chosen by dy's pointer",
    ("offset8", "pitched"), "x 8 bytes past a 16-byte boundary (a narrower vector path); dy's rows at a pitch: dy "
                            "read with x's strides",
    ("offset4", "contiguous"), "x 4 bytes past a 16-byte boundary (two halves at a time), dy aligned: vector paths "
                               "chosen by x's pointer alone",
    ("contiguous_size1", "contiguous_size1"), "size-1 dims (a batch of one, one row, a spatial or hidden size of 1) "
                                              "at non-canonical strides: layouts read off strides",
    ("channels_last_size1", "contiguous"), "NHWC x whose size-1 dims' strides suggest another format: kernels that "
                                           "lay dy out as x's strides suggest",
), read=lambda c: (c.x_format, c.dy_format), fields=lambda v: {"x_format": v[0], "dy_format": v[1]},
    show=lambda v: v[0] if v[0] == v[1] else f"{v[0]}:{v[1]}")

PROFILE = Factor("profile", levels(
    "normal", "well-conditioned data",
    "offset", "|mean| ≫ std: cancellation in one-pass variances and in Σ dy·(x − mean)",
    "near_constant", "variance ≈ eps (or exactly 0): eps handling",
    "heavy_tailed", "a few huge elements dominate every sum",
    "exact", "small integers whose sums are exact: any error is the kernel's",
    "sparse_dy", "mostly-zero dy, some sets none at all",
    "tiny", "rows of magnitude near √eps: where eps and the statistic are the same size",
    "big", "|x| in the thousands about a small mean: squares past 65504 overflow f16",
), read=lambda c: c.profile, fields=lambda v: {"profile": v})

MODES_OF = ("train", "eval")
MODES = levels("train", "batch statistics, the running ones updated",
               "eval", "the running statistics normalise, and come back unchanged")
ORDERS = levels(1, "the backward", 2, "the double backward: derivatives of the statistics only it takes",
                "fwd", "forward mode: the JVP of y, through formulas of its own (torch's forward-AD ones)",
                "fwd-rev", "forward-over-reverse: the JVPs of the gradients (Hessian-vector products)")


def rank_factor(ranks: tuple[int, ...]) -> Factor:
    why = {2: "(N, C): no spatial dims", 3: "one spatial dim", 4: "2-D images (channels_last)",
           5: "3-D volumes (channels_last_3d)"}
    return Factor("rank", levels(*[x for r in ranks for x in (r, why[r])]), read=lambda c: len(c.shape),
                  scan=NO_SCAN)  # (a number of dims, not a size)


def path_factor(params: tuple[str, ...]) -> Factor:
    """Which inputs exist and require grad: every output_mask of a native backward (all, only the
    parameters', only dx, each parameter alone with dx and without)."""
    pairs = [((True, "none"), "every input requires grad"),
             ((True, "x"), "x frozen: only the parameters' gradients"),
             ((True, "params"), "the parameters frozen: only dx"),
             ((False, "none"), "no parameters at all")]
    if len(params) > 1:
        pairs += [((name, frozen), f"{name} alone" + (", x frozen" if frozen == "x" else ""))
                  for frozen in ("none", "x") for name in params]
    return Factor("path", tuple(Level(v, why) for v, why in pairs), read=lambda c: (c.affine, c.frozen),
                  fields=lambda v: {"affine": v[0], "frozen": v[1]}, show=_show_path)


def _show_path(v) -> str:
    params = {True: "all parameters", False: "no parameters"}.get(v[0], f"{v[0]} only")
    return params + ("" if v[1] == "none" else f", {v[1]} frozen")


# The layout's rank, and parameters that exist only in the affine part
LAYOUT_NEEDS_RANK = Exclusion(
    ("layout", "rank"), lambda layout, rank: all(FORMAT_RANK.get(f, rank) == rank for f in layout),
    "channels_last (and channels_last_size1) needs a 4-D input, channels_last_3d a 5-D one")
NO_MIXED_WITHOUT_PARAMETERS = Exclusion(
    ("path", "dtype"), lambda path, dtype: path[0] is not False or dtype[0] == dtype[1],
    "without parameters (and running statistics) nothing is in the parameter dtype")
# eps = 0 divides by the statistic itself: only data whose every set has a positive one
ZERO_EPS_PROFILES = ("near_constant", "exact")
EPS_ZERO_NEEDS_SPREAD = Exclusion(
    ("eps", "profile"), lambda eps, profile: eps != 0 or profile not in ZERO_EPS_PROFILES,
    "eps = 0 with sets of zero variance (near_constant, exact) divides by zero")


# near_constant sets are scaled to eps: with a tiny eps they are constant in half precision, rstd = eps^-1/2 = 1e5,
# and the exact dx (∝ rstd) is past f16's largest value: no f16 kernel can return it
EPS_TINY_NOT_NEAR_CONSTANT = Exclusion(
    ("eps", "profile"), lambda eps, profile: not (eps is not None and 0 < eps < 1e-8 and profile == "near_constant"),
    "near_constant sets with a tiny eps have rstd ~ 1e5: exact gradients past f16's range")


def eps_factor(*values) -> Factor:
    why = {None: "eps=None: the dtype's default", 0.0: "eps = 0: `eps or default` turns it into the default",
           1e-10: "tiny: eps is negligible (a kernel that ignores the argument shows)",
           1e-6: "another common default", 1e-5: "the usual default", 1e-2: "large: where eps enters the formula shows"}
    usual = next((i for i, v in enumerate(values) if v in (1e-5, None)), 0)  # the usual default fills free slots
    return Factor("eps", levels(*[x for v in values for x in (v, why[v])]), read=lambda c: c.eps,
                  fields=lambda v: {"eps": v}, usual=usual)


MOMENTUM = Factor("momentum", levels(
    0.0, "momentum 0: the running statistics stay as they were",
    0.1, "the default",
    1.0, "momentum 1: replaced by the batch's (the first step of a cumulative average, momentum=None)",
), read=lambda c: c.momentum, fields=lambda v: {"momentum": v}, usual=1)


def shared_factors(op) -> tuple[Factor, ...]:
    """The factors every op has, from its record: dtype, layout, profile, rank, path, and mode and order where
    it has eval mode and a double backward (and so forward mode: the same directional-derivative formulas)."""
    factors = [DTYPE, LAYOUT, PROFILE, rank_factor(op.ranks), path_factor(op.params)]
    if op.running_stats:
        factors.append(Factor("mode", MODES, read=lambda c: c.mode, fields=lambda v: {"mode": v}))
    if op.double_backward:
        factors.append(Factor("order", ORDERS, read=lambda c: c.order, fields=lambda v: {"order": v}))
    return tuple(factors)


# ----------------------------------------------------------------------------- paths chosen by three conditions
# A kernel's path is often chosen by several conditions at once: a half-precision vector path for channels-last input
# whose channel count leaves a tail, an eval-only channels-last kernel, a mixed-precision row kernel's tail. Pairs meet
# every two of them in some case, the three together only by chance. The sweep covers every triple of the classes
# kernels dispatch on (cases.sweep.triple_cases): the dtype's, the layout's, the path's (frozen inputs), the mode and
# the remainder of the innermost extent (the dim x's layout puts innermost in memory) by the vector widths.
def dtype_class(v) -> str:
    x, param = v
    return x if x == param and x in ("f64", "f32") else "half" if x == param else "mixed"


def layout_class(v) -> str:
    x, dy = (base_format(f) for f in v)
    if {x, dy} & set(CHANNELS_LAST):
        return "channels-last"
    if x in NON_DENSE:
        return "non-dense"
    if {x, dy} & {"sliced", "pitched", *OFFSET_BYTES}:
        return "misaligned"
    return "standard"


def path_class(v) -> str:
    affine, frozen = v
    if frozen == "x":
        return "x frozen"
    if frozen == "params" or affine is False:
        return "dx only"
    return "every input" if affine is True else "one parameter"


CLASSES = {"dtype": dtype_class, "layout": layout_class, "path": path_class, "mode": str}


@dataclass(frozen=True)
class Remainder:
    """A class of the innermost extent's size by the vector widths that divide it (16, 8, 4, 2 values)."""
    name: str
    holds: Callable[[int], bool]

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """The sizes of the class a triple case takes (past a 16-wide vector), nearest the usual 64 first."""
        return tuple(sorted((n for n in range(17, 129) if self.holds(n)), key=lambda n: (abs(n - 64), n)))


REMAINDERS = (Remainder("whole vectors", lambda n: n % 16 == 0), Remainder("a tail of 8", lambda n: n % 16 == 8),
              Remainder("a tail of 4", lambda n: n % 8 == 4), Remainder("a tail of 2", lambda n: n % 4 == 2),
              Remainder("an odd tail", lambda n: n % 2 == 1))


def remainder_of(n: int) -> str:
    return next(r.name for r in REMAINDERS if r.holds(n))


TRIPLE_STRENGTH = 3


@dataclass(frozen=True)
class Anchor:
    """A case a pairwise design leaves to chance: several factors' values at once (the others at their usual
    levels), added to the covering array when it lacks it. `values`: (factor, value) pairs."""
    values: tuple[tuple[str, Any], ...]
    why: str


# The outputs of the higher orders are differences of terms that cancel: a half-precision case, or one with x
# frozen, gives them a budget as large as themselves. Pairs put order 2 with f64 and with every input requiring
# grad, but in different cases; these are where the second derivatives (and their directional ones) are judged,
# in each layout a kernel has a path of its own for (the channels-last kernels of per-channel and per-group sets
# are code apart; a row-wise op's rows stay rows).
HIGHER_ORDER_ANCHOR = "{order} in {dtype}, {layout}, with every input requiring grad on well-conditioned data"


def shared_anchors(op) -> tuple[Anchor, ...]:
    if not op.double_backward:
        return ()
    layouts = ("contiguous",) + (("channels_last",) if op.unit in ("channel", "group") and 4 in op.ranks else ())
    return tuple(Anchor((("order", order), ("dtype", (dtype, dtype)), ("layout", (layout, layout)),
                         ("path", (True, "none")), ("profile", "normal")),
                        HIGHER_ORDER_ANCHOR.format(order=f"order {order}", dtype=dtype, layout=layout))
                 for layout in layouts for order in (2, "fwd-rev") for dtype in ("f64", "f32"))


def shared_exclusions(op) -> tuple[Exclusion, ...]:
    """Those of the shared factors, and of eps with the profiles (an op without an eps factor drops them)."""
    zero_eps = Exclusion(("eps", "mode"), lambda eps, mode: eps != 0 or mode in op.eps_zero,
                         f"{op.name} takes eps = 0 in {' and '.join(op.eps_zero)} mode only")
    return ((LAYOUT_NEEDS_RANK, EPS_ZERO_NEEDS_SPREAD, EPS_TINY_NOT_NEAR_CONSTANT)
            + (() if op.running_stats else (NO_MIXED_WITHOUT_PARAMETERS,))
            + ((zero_eps,) if op.running_stats and set(MODES_OF) - set(op.eps_zero) else ()))


@dataclass(frozen=True)
class Scanned:
    """A factor's boundary scan as composed: the Scan, its sizes, and those scanned in f64 as well as f32."""
    scan: Scan
    sizes: tuple[int, ...]
    in_every_dtype: frozenset[int]


@dataclass(frozen=True, eq=False)
class Composed:
    """An op's whole design, composed once from its record (Op.design), which the sweep reads instead of composing it
    again at each step: `factors`, the shared ones (each replaced by the op's own of the same name) then its own;
    `exclusions` among them; `anchors`; `shared`, the names of the shared factors (a row fills the op's own, its
    geometry, first); `scans`, each scanned factor's name -> Scanned."""
    factors: tuple[Factor, ...]
    exclusions: tuple[Exclusion, ...]
    anchors: tuple[Anchor, ...]
    shared: frozenset[str]
    scans: dict[str, Scanned]


def compose(op) -> Composed:
    """The op's whole design (Composed) from its record: the shared factors, exclusions and anchors with its own."""
    own = {f.name: f for f in op.sweep.factors}
    shared = shared_factors(op)
    factors = tuple(own.pop(f.name, f) for f in shared) + tuple(own.values())
    names = {f.name for f in factors}
    exclusions = tuple(e for e in shared_exclusions(op) + op.sweep.exclusions if set(e.factors) <= names)
    scans = {}
    for f in factors:
        if (scan := scan_of(f)) is not None:
            sizes = scan_sizes(f)
            scans[f.name] = Scanned(scan, sizes, frozenset(n for n in sizes if scanned_in_every_dtype(n)))
    return Composed(factors, exclusions, shared_anchors(op), frozenset(f.name for f in shared), scans)


# ----------------------------------------------------------------------------- shared geometry
def split_factor(*pairs) -> Factor:
    """The per-rank shares of a distributed op's split axis (Case.split): split_factor(shares, why, ...). Its scan
    is rank 0's share, up to the largest the levels give one rank, beside the usual split's other ranks (one rank of
    one where the usual split has no other)."""
    largest = max(share for shares in pairs[::2] for share in shares)
    scan = Scan(limit=largest, values=lambda n, usual: {"split": (n,) + (tuple(usual[1:]) or (1,))},
                read=lambda c: c.split[0])
    return Factor("split", levels(*pairs), read=lambda c: c.split, fields=lambda v: {"split": v},
                  show=lambda v: ",".join(map(str, v)), scan=scan)


# Channels-last kernels spread channels over vector lanes and a block's threads: up to a block of 1024
CHANNEL_SCAN = Scan(limit=1024)
# Kernels unroll the batch (samples per program, per-sample loops): every unrolling width up to 64
BATCH_SCAN = Scan(limit=64)


def channel_factor(*values) -> Factor:
    why = {1: "one channel: loops over channels of length 1", 3: "fewer channels than a vector's lanes",
           8: "one 8-lane vector", 12: "4 channels per group of 3", 16: "one 16-lane vector",
           64: "many whole vectors", 65: "one past a vector multiple: the scalar tail"}
    return Factor("channels", levels(*[x for v in values for x in (v, why[v])]), read=lambda c: c.channels,
                  usual=values.index(3) if 3 in values else 0, scan=CHANNEL_SCAN)


def spatial_size(case) -> int:
    """Elements per (sample, channel) of an (N, C, *spatial) case: what a spatial factor reads back."""
    return case.numel // (case.shape[0] * case.shape[1])


def nc_spatial(n: int, c: int, spatial: int, rank: int) -> tuple[int, ...]:
    """(N, C, *spatial dims) with `spatial` elements per (sample, channel), spread over rank − 2 dims."""
    return (n, c) + (spread(spatial, rank - 2) if rank > 2 else ())


def at_most(limit: int, a: str, b: str, why: str) -> Exclusion:
    """The product of two factors' values (the elements of a case, with the others small) at most `limit`."""
    return Exclusion((a, b), lambda u, v: u * v <= limit, why, elements=limit)


SPATIAL_NEEDS_RANK = Exclusion(("rank", "spatial"), lambda rank, spatial: rank > 2 or spatial == 1,
                               "a 2-D (N, C) input has no spatial dims")
