"""The textbook BatchNorm / GroupNorm / LayerNorm / InstanceNorm (explicit forward and backward, float32 accumulation
for half inputs) with switchable bugs: the machinery of their mutant catalogues (tests/mutants/
batchnorm.py, groupnorm.py, layernorm.py). One SetView says which elements form a set."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from normcheck.frameworks.torch import accumulation_dtype
from normcheck.numerics.sets import SetView

LANES = 16  # the vector width of the emulated low-precision kernel
BLOCK = 1024  # elements per block of the split-statistics mutants
LONG_SET = 8192  # sets longer than this take the two-halves path of its mutant
CHANNEL_LANES = 8  # the channel vector of the channels-last lane mutant
# The tiled kernels' widths of the boundary mutants (each bug lives on one size path, normcheck's boundary scans)
ROW_TILE = 384       # a row tile of 3·128 values: 768- and 1536-wide rows are whole tiles
WARP = 32            # lanes of a warp: sets of 33..64 values take a two-warp path
ROW_BLOCK = 96       # rows per dγ/dβ partial-sum block (three warps of rows)
PROGRAMS = 48        # programs of a persistent kernel, looping over the rows
PLANE_TILE = 768     # plane elements per block (256 threads x 3)
UNROLL = 8           # samples per unrolled iteration
CHANNEL_VECTOR = 4   # channels per vec4 load (C % 8 == 4 takes the vec4 path: vec8 loads, then one vec4)
# The paths nobody named (the dispatch mutants): pointer alignment, pitched rows, size-table entries, three conditions
VECTOR_BYTES = 16    # the widest vector load; a pointer 8 bytes past a 16-byte boundary takes the 8-byte path
LANES_F32 = 8        # float lanes of a CPU vector (AVX2's Vectorized<float>): tails of C % 8 or D % 8 values
HALF_LANES = 16      # half lanes of one (Vectorized<Half>): a tail of D % 16 values
TABLE_FROM = {5: 1 << 8, 7: 1 << 7}  # a size table's 5·2^j entries from 1280, its 7·2^j ones from 896
HALVES = (torch.float16, torch.bfloat16)


# The bugs on one size path of a tiled kernel (Bugs below): only a case of that size shows them
BOUNDARY_BUGS = ("whole_tile_tail", "two_warp_sets", "plane_tile_tail", "unrolled_batch_tail", "vec4_channel_tail",
                 "table_5x_entry", "table_7x_entry",
                 "persistent_row_tail", "one_row_param_block")
# The bugs on a path chosen by storage geometry or by three conditions at once (_dispatched): the class triples and the
# offset and pitched layouts reach them
DISPATCH_BUGS = ("vec8_path_last_vector", "row_stride_as_length", "half_channels_last_tail", "eval_channels_last_tail",
                 "mixed_tail_weight", "frozen_x_half_tail")


@dataclass(frozen=True)
class Bugs:
    unbiased_normalise: bool = False        # normalise by the unbiased variance (M − 1)
    naive_variance: bool = False            # var = E[x²] − E[x]²
    low_precision_accumulation: bool = False  # sums accumulated in the f16/bf16 input dtype
    drop_xhat_term: bool = False            # dx forgets −x̂·mean(dy·x̂)
    biased_running_var: bool = False        # running_var updated with the biased variance
    ignore_strides: bool = False            # reads x and dy as if they were contiguous
    ignore_storage_offset: bool = False     # reads x and dy from the start of their storage
    gamma_outside_group_sums: bool = False  # GN: γ applied outside the group sums (BN formula)
    bf16_moments: bool = False              # mean and invstd rounded to bf16
    eps_outside_sqrt: bool = False          # invstd = 1 / (sqrt(var) + eps)
    momentum_swapped: bool = False          # running = m·running + (1 − m)·batch
    interleaved_groups: bool = False        # GN: channel c in group c % G instead of c // G
    modifies_input: bool = False            # centres x in place and leaves it that way
    per_sample_variance: bool = False       # BN: average of per-sample variances
    dweight_missing_invstd: bool = False    # dγ = Σ dy·(x − μ)
    low_precision_param_sums: bool = False  # dγ, dβ summed over the batch/rows in the f16/bf16 input dtype
    batch_statistics: bool = False          # IN: normalises with the channel's statistics over the batch (BN)
    running_var_pooled: bool = False        # IN: running_var from the variance pooled over the batch
    eval_uses_batch_stats: bool = False     # eval mode normalises with the batch's statistics (ignores training)
    eval_updates_running_stats: bool = False  # eval mode uses the running statistics but updates them too
    constant_stats_double_backward: bool = False  # backward from the forward's μ, invstd: constants to a 2nd derivative
    overwrites_dy: bool = False             # backward writes dx into grad_output's buffer
    frozen_x_fast_path: bool = False        # with x frozen, a fast path computes dγ = Σ dy·(x − μ)
    frozen_params_fast_path: bool = False   # with γ frozen, a fast path computes dx as if γ were 1
    nondeterministic_sum: bool = False      # dγ, dβ summed over the batch in an order that varies per call
    # Bugs on the paths kernels dispatch on
    one_set_blocks: bool = False            # one set (a single row or channel): blocks' statistics averaged unweighted
    long_set_halves: bool = False           # sets past 8192 values: two halves' variances averaged, no between term
    channels_last_lane_sums: bool = False   # BN channels-last: an 8-wide channel loop sums across its lanes
    raw_stride_layout: bool = False         # channels-last x: dy laid out as x's raw strides suggest, read as NHWC
    eval_hard_coded_eps: bool = False       # BN eval mode (a frozen BatchNorm) normalises with eps = 1e-5
    fixed_momentum: bool = False            # running statistics updated with momentum 0.1 whatever is passed
    hard_coded_eps: bool = False            # eps = 1e-5 whatever is passed
    g1_per_pixel: bool = False              # GN with G = 1 normalises each pixel over the channels
    gc_drops_bias: bool = False             # GN with G = C forgets β in the forward
    # Bugs of the forward-mode formula (jvp) alone: forward and backward stay right
    jvp_missing_stat_terms: bool = False    # ẏ = γ·ẋ·invstd: the tangents of the mean and invstd left out
    jvp_ignores_weight_tangent: bool = False  # ẏ without γ̇·x̂
    # Bugs on one size path of a tiled kernel: right at every size but the path's
    whole_tile_tail: bool = False     # a set of whole 384-value tiles: the "tail" mask of width 0 drops the last tile
    two_warp_sets: bool = False       # sets of 33..64 values: warp 1's partial sum read before it is written
    plane_tile_tail: bool = False     # planes of whole 768-element tiles: the last tile left out of the sums
    unrolled_batch_tail: bool = False  # N = 8k + 1 samples: the remainder sample reuses the last unrolled statistics
    vec4_channel_tail: bool = False   # C % 8 == 4: the trailing vec4 of channels takes the previous vector's statistics
    persistent_row_tail: bool = False  # 48 persistent programs, rows = 48k + 1: the tail round of one row is skipped
    one_row_param_block: bool = False  # dγ/dβ in blocks of 96 rows, rows = 96k + 1: a block of one row is skipped
    # Bugs on paths chosen by storage geometry, a size table's entries, or three conditions at once (_dispatched):
    # right on every case that does not meet the path's every condition
    vec8_path_last_vector: bool = False   # x 8 bytes past a 16-byte boundary: the 8-byte path leaves the last vector out
    row_stride_as_length: bool = False    # x with unit-stride rows at a pitch: rows read at the row length
    table_5x_entry: bool = False          # sets of 5·2^j values (1280, 2560, 5120, ...): the 4·2^j entry's count used
    table_7x_entry: bool = False          # sets of 7·2^j values (896, 1792, 3584, ...): the last warp's sums dropped
    half_channels_last_tail: bool = False  # BN, half input, channels-last, C % 8 != 0: tail channels reuse lane stats
    eval_channels_last_tail: bool = False  # BN eval, channels-last, C % 8 != 0: tail channels normalised by the lanes'
    mixed_tail_weight: bool = False       # LN, half x with f32 γ, contiguous, D % 8 == 4: the vec4 tail takes γ, β 8 back
    frozen_x_half_tail: bool = False      # LN, x frozen, half x, D % 16 == 8: dγ, dβ of the 8-value tail left at zero
    # Not bugs: another correct form of the same formula (a kernel may write either)
    uncentred_jvp: bool = False  # invstd̊ = −invstd³·mean((x − μ)·ẋ): the tangent left uncentred in the product
    tiled_sums: bool = False     # each set's statistics from tiles of 384 values merged by their counts (Chan et al.)
    dispatched_paths: bool = False  # the size table's entries done right: each set's statistics merged from the
    #                                 fifths or sevenths the entry's threads read (Chan et al.)


def _read(t: torch.Tensor, bugs: Bugs, tensor: str = "x") -> torch.Tensor:
    if tensor == "x" and getattr(bugs, "row_stride_as_length", False):  # (_dispatched: rows at a pitch) read packed
        # (getattr: tests/mutants/rmsnorm.py reads through here with Bugs of its own)
        return t.as_strided(t.shape, _packed_strides(t.shape), t.storage_offset())
    if bugs.ignore_strides and not t.is_contiguous():
        # Index the storage with contiguous strides from the tensor's first element.
        return t.as_strided(t.shape, _packed_strides(t.shape))
    if bugs.ignore_storage_offset and t.storage_offset():
        return t.as_strided(t.shape, t.stride(), 0)
    return t


def _dy_for(x: torch.Tensor, dy: torch.Tensor, bugs: Bugs) -> torch.Tensor:
    """dy as the backward reads it. The raw-stride-layout mutant's channels-last fast path (taken when torch says x is
    channels-last) lays dy out in the format x's strides suggest, read in NHWC order with no exception for a size-1
    dim, and then reads dy's storage as NHWC: right wherever x's strides are canonical, wrong where a size-1 dim's
    stride breaks the order and dy is left contiguous."""
    if not (bugs.raw_stride_layout and x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and not x.is_contiguous()):
        return dy
    s = x.stride()
    fmt = torch.channels_last if s[1] <= s[3] <= s[2] <= s[0] else torch.contiguous_format
    dense = dy.contiguous(memory_format=fmt)
    n, c, h, w = dense.shape
    return dense.as_strided(dense.shape, (h * w * c, 1, w * c, c))


def _sum(a: torch.Tensor, axes, bugs: Bugs, low: torch.dtype, in_low: bool | None = None) -> torch.Tensor:
    """Sum over `axes` keeping dims; optionally (`in_low`, by default the low-precision-accumulation
    bug) like a 16-lane kernel accumulating in `low`."""
    in_low = bugs.low_precision_accumulation if in_low is None else in_low
    if not (in_low and low in (torch.float16, torch.bfloat16)):
        return a.sum(dim=axes, keepdim=True)
    kept = [d for d in range(a.dim()) if d not in axes]
    moved = a.permute(*kept, *axes)
    flat = moved.reshape(*moved.shape[: len(kept)], -1)
    pad = (-flat.shape[-1]) % LANES
    flat = torch.nn.functional.pad(flat, (0, pad)).reshape(*flat.shape[:-1], -1, LANES).to(low)
    lanes = torch.zeros_like(flat[..., 0, :])
    for step in range(flat.shape[-2]):
        lanes = lanes + flat[..., step, :]  # rounds to `low` after every add
    total = lanes.sum(dim=-1, dtype=low)
    shape = [1 if d in axes else s for d, s in enumerate(a.shape)]
    return total.to(a.dtype).reshape(shape)


def _statistics(xs, view: SetView, eps, bugs: Bugs, low, running):
    """(μ, σ², 1/sqrt(σ² + eps)) of the grouped x (torch ops: differentiable when recomputed in backward);
    `running` (eval mode): the running statistics instead."""
    axes, count = view.axes, view.set_size
    if running is not None:
        mu, var = (view.per_channel_values(r.to(xs.dtype)) for r in running)
    elif bugs.per_sample_variance and view.across_batch:
        mu = xs.mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
        var = ((xs - xs.mean(dim=(2, 3), keepdim=True)) ** 2).mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
    elif (bugs.one_set_blocks and view.set_count == 1 and count > BLOCK) or (bugs.long_set_halves and count > LONG_SET):
        mu, var = _split_statistics(xs, view, BLOCK if bugs.one_set_blocks else (count + 1) // 2)
    elif bugs.tiled_sums and not view.across_batch and view.s_in_sets:
        mu, var = _tiled_statistics(xs, axes)
    elif bugs.dispatched_paths and (chunk := _path_chunk(view, low)) is not None:
        mu, var = _tiled_statistics(xs, axes, chunk)
    elif (unseen := _unseen(view, bugs, low)) is not None:
        seen = 1 - unseen.to(xs.dtype)
        mu = (xs * seen).sum(dim=axes, keepdim=True) / count
        var = ((xs - mu) * seen).pow(2).sum(dim=axes, keepdim=True) / count
    else:
        mu = _sum(xs, axes, bugs, low) / count
        if bugs.naive_variance:
            var = _sum(xs * xs, axes, bugs, low) / count - mu * mu
        else:
            var = _sum((xs - mu) ** 2, axes, bugs, low) / count
    if bugs.channels_last_lane_sums and view.across_batch:
        mu, var = _lanes_mixed(mu), _lanes_mixed(var)
    if running is None:
        mu, var = _reused_statistics(mu, view, bugs), _reused_statistics(var, view, bugs)
    if bugs.half_channels_last_tail or bugs.eval_channels_last_tail:  # (_dispatched: the path's conditions met)
        mu, var = _lane_tail(mu), _lane_tail(var)
    norm_var = var * count / (count - 1) if bugs.unbiased_normalise and running is None else var
    invstd = 1 / (norm_var.clamp_min(0).sqrt() + eps) if bugs.eps_outside_sqrt else (norm_var.clamp_min(0) + eps).rsqrt()
    if bugs.bf16_moments:
        mu, invstd = mu.to(torch.bfloat16).to(xs.dtype), invstd.to(torch.bfloat16).to(xs.dtype)
    return mu, var, invstd


def _tiled_statistics(xs, axes, tile: int = ROW_TILE):
    """(μ, σ²) of each set as a tiled kernel computes them: per tile of `tile` values, then merged weighted by
    the tiles' counts, the spread of the tile means included (a correct merge: the last tile may be short)."""
    n, k, l, s = xs.shape
    tiles = xs.reshape(n, k, l * s).split(tile, dim=2)
    counts = torch.tensor([t.shape[2] for t in tiles], dtype=xs.dtype)
    means = torch.stack([t.mean(dim=2) for t in tiles], dim=2)
    squares = torch.stack([(t - t.mean(dim=2, keepdim=True)).pow(2).sum(dim=2) for t in tiles], dim=2)
    mu = (means * counts).sum(dim=2) / counts.sum()
    var = (squares + counts * (means - mu[..., None]).pow(2)).sum(dim=2) / counts.sum()
    return mu.reshape(n, k, 1, 1), var.reshape(n, k, 1, 1)


def _unseen(view: SetView, bugs: Bugs, low: torch.dtype):
    """A (1, 1, L, S) mask of the elements a tiled kernel's loops leave out of every set's sums (None: none)."""
    if view.across_batch or not view.s_in_sets:
        return None
    _, _, l, s = view.grouped_shape
    index = torch.arange(l * s).reshape(1, 1, l, s)
    if bugs.whole_tile_tail and l * s > ROW_TILE and l * s % ROW_TILE == 0:
        return index >= l * s - ROW_TILE
    if bugs.two_warp_sets and WARP < l * s <= 2 * WARP:
        return index >= WARP
    if bugs.plane_tile_tail and s > PLANE_TILE and s % PLANE_TILE == 0:
        return index % s >= s - PLANE_TILE
    if bugs.vec8_path_last_vector:  # (_dispatched: the 8-byte path; its loop bound one vector short)
        return index >= l * s - VECTOR_BYTES // 2 // low.itemsize
    run = s if s > 1 else l  # (the extent a table is indexed by: a row's length, a GroupNorm plane's size)
    for odd, flag in ((5, bugs.table_5x_entry), (7, bugs.table_7x_entry)):
        if flag and _table_entry(run, odd):  # the entry's threads cover (odd − 1)/odd of each row or plane
            return index % run >= run - run // odd
    return None


def _table_entry(n: int, odd: int) -> bool:
    """n is an entry odd·2^j of a size table's (from TABLE_FROM[odd])."""
    return n % odd == 0 and n >= TABLE_FROM[odd] * odd and (n // odd) & (n // odd - 1) == 0


def _path_chunk(view: SetView, low: torch.dtype) -> int | None:
    """The chunk a dispatched path reads each set in (a table entry's fifth or seventh), None off those paths."""
    if view.across_batch or not view.s_in_sets:
        return None
    _, _, l, s = view.grouped_shape
    if s > 1:  # (a plane's table: the chunks are per plane, which the merged tiles of a set do not follow)
        return None
    return next((l // odd for odd in TABLE_FROM if _table_entry(l, odd)), None)


def _lane_tail(stat):
    """Per-channel statistics (1, C, 1, 1) whose last C % 8 channels (the scalar tail after the 8-lane vectors) took
    those of the channels 8 before (the last vector's lanes, left in the registers)."""
    c = stat.shape[1]
    tail = c % LANES_F32
    return torch.cat([stat[:, :c - tail], stat[:, c - tail - LANES_F32:c - LANES_F32]], dim=1)


def _packed_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.insert(0, acc)
        acc *= size
    return tuple(strides)


def _reused_statistics(stat, view: SetView, bugs: Bugs):
    """Per-set statistics where an unrolled loop's remainder reuses the registers of the iteration before: the
    last sample's (N = 8k + 1) or the last vec4 of channels (C % 8 == 4)."""
    n, k = stat.shape[0], stat.shape[1]
    if bugs.unrolled_batch_tail and not view.across_batch and n > UNROLL and n % UNROLL == 1:
        return torch.cat([stat[:-1], stat[-2:-1]], dim=0)
    if bugs.vec4_channel_tail and view.across_batch and k > CHANNEL_VECTOR and k % 8 == CHANNEL_VECTOR:
        return torch.cat([stat[:, :-CHANNEL_VECTOR], stat[:, -2 * CHANNEL_VECTOR:-CHANNEL_VECTOR]], dim=1)
    return stat


def _rows_kept(view: SetView, bugs: Bugs, dtype, for_params: bool):
    """(N, 1, 1, 1): 0 on the rows a row-wise kernel never processes (its outputs left as zeros) or leaves out of
    dγ/dβ (`for_params`), else None."""
    rows = view.grouped_shape[0]
    if view.across_batch or view.blocks != 1:
        return None
    skipped = ((bugs.persistent_row_tail and rows > PROGRAMS and rows % PROGRAMS == 1)
               or (for_params and bugs.one_row_param_block and rows > ROW_BLOCK and rows % ROW_BLOCK == 1))
    if not skipped:
        return None
    kept = torch.ones(rows, 1, 1, 1, dtype=dtype)
    kept[-1] = 0
    return kept


def _split_statistics(xs, view: SetView, block: int):
    """(μ, σ²) of each set from blocks of `block` values: the blocks' means and variances averaged with equal
    weights (the last, shorter block counts as much as a whole one), with the spread of the block means."""
    n, k = xs.shape[0], xs.shape[1]
    sets = xs.permute(1, 0, 2, 3).reshape(k, -1) if view.across_batch else xs.reshape(n * k, -1)
    blocks = sets.split(block, dim=1)
    means = torch.stack([b.mean(dim=1) for b in blocks], dim=1)
    variances = torch.stack([b.var(dim=1, unbiased=False) for b in blocks], dim=1)
    mu = means.mean(dim=1)
    var = variances.mean(dim=1) + ((means - mu[:, None]) ** 2).mean(dim=1)
    shape = (1, k, 1, 1) if view.across_batch else (n, k, 1, 1)
    return mu.reshape(shape), var.reshape(shape)


def _lanes_mixed(stat):
    """Per-channel statistics (1, C, 1, 1) where each whole vector of 8 channels got its vector's mean (a
    horizontal add across lanes); the channels of the scalar tail are right."""
    c = stat.shape[1]
    whole = c - c % CHANNEL_LANES
    if not whole:
        return stat
    lanes = stat[:, :whole].reshape(1, -1, CHANNEL_LANES, 1, 1).mean(dim=2, keepdim=True).expand(-1, -1, CHANNEL_LANES, 1, 1)
    return torch.cat([lanes.reshape(1, whole, 1, 1), stat[:, whole:]], dim=1)


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, view: SetView, eps, bugs: Bugs, stats_out, running=None):
        low = x.dtype
        acc = accumulation_dtype(x.dtype)
        xs = view.group(_read(x, bugs).to(acc))
        mu, var, invstd = _statistics(xs, view, eps, bugs, low, running)
        xhat = (xs - mu) * invstd
        ones = torch.ones(view.param_shape, dtype=acc)
        gamma = view.per_channel_values(weight.to(acc) if weight is not None else ones)
        beta = view.per_channel_values(bias.to(acc) if bias is not None else 0 * ones)
        out = xhat * gamma + beta
        kept = _rows_kept(view, bugs, acc, for_params=False)
        y = view.ungroup(out if kept is None else out * kept).to(low)
        if bugs.modifies_input:
            x.sub_(view.ungroup(mu.expand_as(xs)).to(x.dtype))
        stats_out.update(mean=mu, var=var, count=view.set_size)
        # The backward recomputes the statistics from x, so that a double backward differentiates them too;
        # the constant-statistics mutant (and one whose x changed since) uses the forward's, held constant.
        ctx.recompute = not (bugs.constant_stats_double_backward or bugs.modifies_input)
        ctx.save_for_backward(x, weight, mu, invstd)
        ctx.save_for_forward(x, weight, mu, invstd)
        ctx.view, ctx.bugs, ctx.low, ctx.eps, ctx.running = view, bugs, low, eps, running
        ctx.param_dtypes = (None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mu, invstd = ctx.saved_tensors
        view, bugs, low = ctx.view, ctx.bugs, ctx.low
        axes, count = view.axes, view.set_size
        acc = mu.dtype
        xs = view.group(_read(x, bugs).to(acc))
        if ctx.recompute:
            mu, _, invstd = _statistics(xs, view, ctx.eps, bugs, low, ctx.running)
        xhat = (xs - mu) * invstd
        needs = ctx.needs_input_grad
        frozen_gamma = bugs.frozen_params_fast_path and weight is not None and not needs[1]
        gamma = view.per_channel_values(weight.to(acc) if weight is not None and not frozen_gamma
                                        else torch.ones(view.param_shape, dtype=acc))
        dys = view.group(_read(_dy_for(x, dy, bugs), bugs, "dy").to(acc))
        if ctx.running is not None:  # eval mode: the statistics do not depend on x
            mean_g = mean_gx = torch.zeros_like(mu)
        elif bugs.gamma_outside_group_sums:
            mean_g = gamma * _sum(dys, axes, bugs, low) / count
            mean_gx = gamma * _sum(dys * xhat, axes, bugs, low) / count
        else:
            mean_g = _sum(gamma * dys, axes, bugs, low) / count
            mean_gx = _sum(gamma * dys * xhat, axes, bugs, low) / count
        if bugs.drop_xhat_term:
            mean_gx = torch.zeros_like(mean_gx)
        dxs = invstd * (gamma * dys - mean_g - xhat * mean_gx)
        kept = _rows_kept(view, bugs, acc, for_params=False)
        dx = view.ungroup(dxs if kept is None else dxs * kept).to(low)
        kept_params = _rows_kept(view, bugs, acc, for_params=True)
        if kept_params is not None:
            dys = dys * kept_params
        if bugs.overwrites_dy:  # dx written into grad_output's buffer (and returned from it)
            dx = dy.copy_(dx)
        xterm = xhat / invstd if bugs.dweight_missing_invstd or (bugs.frozen_x_fast_path and not needs[0]) else xhat
        wdt, bdt = ctx.param_dtypes

        def param_sum(a):  # over N and S: (N, K, L, S) -> the parameter's shape
            if bugs.nondeterministic_sum:  # per-sample partial sums added in an order that changes from call to call
                partials = a.sum(dim=-1)[torch.randperm(a.shape[0])]  # (as atomics from one block per sample)
                total = partials[0]
                for p in partials[1:]:  # one add at a time in the accumulation dtype (cumsum would add in f64)
                    total = total + p
                return total.reshape(view.param_shape)
            return _sum(a, (0, 3), bugs, low, bugs.low_precision_param_sums).reshape(view.param_shape)

        dweight = param_sum(dys * xterm).to(wdt) if wdt is not None else None
        dbias = param_sum(dys).to(bdt) if bdt is not None else None
        if bugs.frozen_x_half_tail:  # (_dispatched) the half column kernel's 8-wide loop stops before the tail
            dweight, dbias = (None if g is None else _tail_zeroed(g) for g in (dweight, dbias))
        return dx, dweight, dbias, None, None, None, None, None

    @staticmethod
    def jvp(ctx, tx, tweight, tbias, *_):
        """ẏ = γ·x̂̇ + γ̇·x̂ + β̇ with x̂̇ = ḋ·invstd + (x − μ)·invstd̊, ḋ = ẋ − mean(ẋ), invstd̊ = −invstd³·mean((x − μ)·ḋ)
        (eval mode: x̂̇ = ẋ·invstd, the running statistics are constants)."""
        x, weight, mu, invstd = ctx.saved_tensors
        view, bugs, axes = ctx.view, ctx.bugs, ctx.view.axes
        acc = mu.dtype
        dev = view.group(x.to(acc)) - mu
        xhat = dev * invstd
        tx = view.group(tx.to(acc)) if tx is not None else torch.zeros_like(dev)
        if ctx.running is None and not bugs.jvp_missing_stat_terms:
            tdev = tx - tx.mean(dim=axes, keepdim=True)
            product = dev * (tx if bugs.uncentred_jvp else tdev)  # (equal in exact arithmetic: mean(x − μ) = 0)
            txhat = tdev * invstd - dev * invstd ** 3 * product.mean(dim=axes, keepdim=True)
        else:
            txhat = tx * invstd
        gamma = view.per_channel_values(weight.to(acc)) if weight is not None else 1
        ty = gamma * txhat
        if tweight is not None and not bugs.jvp_ignores_weight_tangent:
            ty = ty + view.per_channel_values(tweight.to(acc)) * xhat
        if tbias is not None:
            ty = ty + view.per_channel_values(tbias.to(acc))
        return view.ungroup(ty).to(ctx.low)


def _dispatched(bugs: Bugs, x: torch.Tensor, view: SetView, param=None, training: bool = True) -> Bugs:
    """`bugs` with each dispatch mutant's bug kept only where x meets its path's every condition, as the kernels they
    are modelled on decide: from x's pointer, strides, dtype and sizes, the parameters' dtype (`param`: γ, or β where
    there is no γ), the mode."""
    half, n, ndim = x.dtype in HALVES, view.set_size, x.dim()
    channels_last = ndim in (4, 5) and not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last if ndim == 4 else torch.channels_last_3d)
    lane_tail = ndim > 1 and x.shape[1] > LANES_F32 and x.shape[1] % LANES_F32 != 0
    vec4_tail = n > LANES_F32 and n % LANES_F32 == LANES_F32 // 2  # 8-lane float vectors, then one of 4
    half_tail = n > HALF_LANES and n % HALF_LANES == HALF_LANES // 2  # 16-lane half vectors, then one of 8
    rows_of_sets = view.s_in_sets and not view.across_batch
    paths = {
        # aten/src/ATen/native/cuda/layer_norm_kernel.cu's can_vectorize, apex's alignment checks: a vector width from
        # the pointer; this kernel has an 8-byte path (float2, half4) for pointers 8 bytes past a 16-byte boundary
        "vec8_path_last_vector": (x.element_size() < 8 and x.is_contiguous() and rows_of_sets
                                  and x.data_ptr() % VECTOR_BYTES == VECTOR_BYTES // 2
                                  and n * x.element_size() % (VECTOR_BYTES // 2) == 0),
        # Liger-Kernel's and the Triton tutorial's wrappers hand a 2-D view and its row stride to the kernel; this one
        # copies only inputs whose last dim is not unit-stride, and its kernel steps rows by n_cols
        "row_stride_as_length": ndim > 1 and x.stride(-1) == 1 and not x.is_contiguous() and 0 not in x.stride(),
        # aten/src/ATen/native/cpu/batch_norm_kernel.cpp: channels-last loops over C in Vectorized<float> lanes (8
        # on AVX2), a scalar tail after them; the reduced-precision (opmath float) path and the eval path are apart
        "half_channels_last_tail": half and channels_last and lane_tail and view.across_batch,
        "eval_channels_last_tail": not training and channels_last and lane_tail and view.across_batch,
        # aten/src/ATen/native/cpu/layer_norm_kernel.cpp's mixed-type kernel (half x, float γ, β): 8-lane vectors, a tail
        "mixed_tail_weight": (half and param is not None and param.dtype == torch.float32 and x.is_contiguous()
                              and vec4_tail and rows_of_sets),
        # ATen's and apex's γ/β-only backward (GammaBetaBackward, cuComputeGradGammaBeta) when x needs no gradient
        "frozen_x_half_tail": half and not x.requires_grad and half_tail and rows_of_sets,
    }
    return replace(bugs, **{name: getattr(bugs, name) and taken for name, taken in paths.items()})


def _tail_shifted(p: torch.Tensor) -> torch.Tensor:
    """γ or β as a tail that reuses the last vector's lanes reads it: its last D % 8 values those 8 before."""
    flat = p.reshape(-1)
    d = flat.numel()
    tail = d % LANES_F32
    return torch.cat([flat[:d - tail], flat[d - tail - LANES_F32:d - LANES_F32]]).reshape(p.shape)


def _tail_zeroed(g: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient whose last D % 16 values a 16-lane loop never reached."""
    flat = g.reshape(-1).clone()
    flat[flat.numel() - flat.numel() % HALF_LANES:] = 0
    return flat.reshape(g.shape)


def _batch_norm(bugs: Bugs):
    def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5):
        stats = {}
        running = _eval_statistics(training, running_mean, running_var, bugs)
        if bugs.eval_hard_coded_eps and not training:
            eps = 1e-5
        if bugs.fixed_momentum:
            momentum = 0.1
        channels_last = input.dim() == 4 and input.is_contiguous(memory_format=torch.channels_last) and not input.is_contiguous()
        view = SetView.per_channel(tuple(input.shape))
        path_bugs = _dispatched(bugs if channels_last else replace(bugs, channels_last_lane_sums=False), input, view,
                                weight, training)
        y = _Norm.apply(input, weight, bias, view, eps, path_bugs, stats, running)
        if running is None or bugs.eval_updates_running_stats:
            batch = stats if running is None else _batch_stats(input, SetView.per_channel(tuple(input.shape)), path_bugs)
            mean, var, count = batch["mean"].reshape(-1), batch["var"].reshape(-1), batch["count"]
            _update_running(running_mean, running_var, mean, var, count, bugs, momentum)
        return y
    return batch_norm


def _eval_statistics(training: bool, running_mean, running_var, bugs: Bugs):
    """The statistics eval mode normalises with: the running ones (None: the batch's, training mode)."""
    if training or bugs.eval_uses_batch_stats:
        return None
    return running_mean.detach().clone(), running_var.detach().clone()


def _batch_stats(x, view: SetView, bugs: Bugs) -> dict:
    """The batch's statistics (for a running-statistics update), as the forward would have computed them."""
    with torch.no_grad():
        xs = view.group(_read(x, bugs).to(accumulation_dtype(x.dtype)))
        mu, var, _ = _statistics(xs, view, 0.0, bugs, x.dtype, None)
    return {"mean": mu, "var": var, "count": view.set_size}


def _update_running(running_mean, running_var, mean, var, count, bugs: Bugs, momentum: float):
    """running = (1 − m)·running + m·batch (unbiased variance), in the accumulation dtype, rounded once."""
    with torch.no_grad():
        running = var if bugs.biased_running_var else var * count / (count - 1)
        keep, take = (momentum, 1 - momentum) if bugs.momentum_swapped else (1 - momentum, momentum)
        running_mean.copy_(keep * running_mean.to(mean.dtype) + take * mean)
        running_var.copy_(keep * running_var.to(var.dtype) + take * running)


def _instance_norm(bugs: Bugs):
    def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                      momentum=0.1, eps=1e-5):
        shape = tuple(input.shape)
        view = SetView.per_channel(shape) if bugs.batch_statistics else SetView.per_group(shape, shape[1])
        stats = {}
        running = _eval_statistics(use_input_stats, running_mean, running_var, bugs)
        y = _Norm.apply(input, weight, bias, view, eps, _dispatched(bugs, input, view, weight, use_input_stats), stats,
                        running)
        if running_mean is not None and (running is None or bugs.eval_updates_running_stats):
            n, c = shape[0], shape[1]
            stats = stats if running is None else _batch_stats(input, view, bugs)
            mean, var, count = stats["mean"].reshape(-1, c), stats["var"].reshape(-1, c), stats["count"]
            if bugs.running_var_pooled:  # the batch's variance about its pooled mean: adds the spread of the means
                var = var + (mean - mean.mean(dim=0)) ** 2
            _update_running(running_mean, running_var, mean.mean(dim=0), var.mean(dim=0), count, bugs, momentum)
        return y
    return instance_norm


def _group_norm(bugs: Bugs):
    def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
        c = input.shape[1]
        if bugs.interleaved_groups:
            # Channel c joins group c % G: permute channels so that grouping is contiguous again.
            order = torch.arange(c).reshape(c // num_groups, num_groups).t().reshape(-1)
            inverse = torch.argsort(order)
            permuted = _group_norm(replace(bugs, interleaved_groups=False))(
                input[:, order], num_groups,
                None if weight is None else weight[order], None if bias is None else bias[order], eps)
            return permuted[:, inverse]
        if bugs.g1_per_pixel and num_groups == 1:  # LayerNorm over C at every pixel: (N, *spatial, C)
            moved = input.movedim(1, -1)
            return _layer_norm(bugs)(moved, (c,), weight, bias, eps).movedim(-1, 1)
        view = SetView.per_group(tuple(input.shape), num_groups)
        y = _Norm.apply(input, weight, bias, view, eps, _dispatched(bugs, input, view, weight), {})
        if bugs.gc_drops_bias and num_groups == c and bias is not None:  # β left out of y (its gradient is still Σ dy)
            y = y - bias.detach().reshape(1, c, *[1] * (input.dim() - 2)).to(y.dtype)
        return y
    return group_norm


def _layer_norm(bugs: Bugs):
    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        eps = 1e-5 if bugs.hard_coded_eps else eps
        view = SetView.last_dims(tuple(input.shape), len(normalized_shape))
        path_bugs = _dispatched(bugs, input, view, weight if weight is not None else bias)
        if path_bugs.mixed_tail_weight:
            weight, bias = (None if p is None else _tail_shifted(p) for p in (weight, bias))
        return _Norm.apply(input, weight, bias, view, eps, path_bugs, {})
    return layer_norm


CORRECT = Bugs()


def batch_norm(bugs: Bugs = CORRECT):
    """F.batch_norm's signature, with `bugs` switched on."""
    return _batch_norm(bugs)


def group_norm(bugs: Bugs = CORRECT):
    """F.group_norm's signature, with `bugs` switched on."""
    return _group_norm(bugs)


def layer_norm(bugs: Bugs = CORRECT):
    return _layer_norm(bugs)


def instance_norm(bugs: Bugs = CORRECT):
    """F.instance_norm's signature (use_input_stats=True), with `bugs` switched on."""
    return _instance_norm(bugs)


def named(make, bug: str):
    """The mutant with one bug, named after it (so `--impl module:bug` finds it)."""
    fn = make(Bugs(**{bug: True}))
    fn.__qualname__ = bug
    return fn
