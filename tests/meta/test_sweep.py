"""The default sweep is a pairwise covering design over the axes that expose bug classes."""
from itertools import combinations, product

import pytest

from normcheck.numerics.profiles import PROFILES
from normcheck.cases.sweep import SIZES, SWEEP_DTYPES, SWEEP_LAYOUTS, default_sweep
from normcheck.cases.case import FROZEN, GRADIENTS
from normcheck.ops import OPS, get_op


@pytest.mark.parametrize("op", ["batchnorm", "groupnorm", "layernorm"])
def test_pairwise_coverage(op):
    cases = default_sweep(op)
    size_of = {shape: size for size, by_rank in get_op(op).sweep.shapes.items() for shape in by_rank.values()}
    dtypes = {(c.dtype, c.param_dtype) for c in cases}
    layouts = {(c.x_format, c.dy_format) for c in cases}
    assert dtypes == set(SWEEP_DTYPES) and layouts == set(SWEEP_LAYOUTS)
    pairs = {
        "dtype×layout": ({((c.dtype, c.param_dtype), (c.x_format, c.dy_format)) for c in cases},
                         set(product(SWEEP_DTYPES, SWEEP_LAYOUTS))),
        "profile×layout": ({(c.profile, (c.x_format, c.dy_format)) for c in cases},
                           set(product(PROFILES, SWEEP_LAYOUTS))),
        "dtype×profile×size": ({((c.dtype, c.param_dtype), c.profile, size_of[c.shape]) for c in cases},
                               set(product(SWEEP_DTYPES, PROFILES, SIZES))),
    }
    for name, (seen, wanted) in pairs.items():
        assert seen == wanted, f"{name} misses {sorted(wanted - seen)[:3]}"


@pytest.mark.parametrize("op", ["batchnorm", "groupnorm"])
def test_sizes_ranks_and_parameters_vary(op):
    cases = default_sweep(op)
    sizes = {c.view.set_size for c in cases}
    assert sizes == {8, 8192, 65536}
    assert {len(c.shape) for c in cases} == {2, 3, 4, 5}
    assert {c.affine for c in cases} >= {True, False}
    if op == "groupnorm":
        hxw = {c.numel // (c.shape[0] * c.shape[1]) for c in cases}
        assert min(hxw) < 2048 <= max(hxw)  # both sides of torch's strategy threshold
        assert any(c.shape[1] // c.groups > 1 for c in cases)  # γ varies inside a group


@pytest.mark.parametrize("op", list(OPS))
def test_every_path_the_op_allows_is_in_its_sweep(op):
    """Every set of gradients it can be asked for (every output_mask of a native backward: each parameter alone,
    with and without dx, x or the parameters frozen), eval mode where it has running statistics and the double
    backward where it has one, those two in every dtype."""
    record, cases = get_op(op), default_sweep(op)
    names = [g for g, wrt in GRADIENTS.items() if wrt == "x" or wrt in record.params]
    masks = {tuple(sorted(grads)) for k in range(1, len(names) + 1) for grads in combinations(names, k)}
    if record.distributed:  # the SyncBN sweep has 30 cases: each parameter alone with dx, or both without
        masks = {m for m in masks if "dx" in m or len(m) == len(names) - 1}
    assert {tuple(sorted(c.grads)) for c in cases} >= masks
    assert {c.frozen for c in cases} == set(FROZEN)
    dtypes = {c.dtypes for c in cases}
    assert {c.dtypes for c in cases if c.mode == "eval"} == (dtypes if record.running_stats else set())
    assert {c.dtypes for c in cases if c.order == 2} == (dtypes if record.double_backward else set())


def test_sweep_is_deterministic_and_seeded():
    assert default_sweep("batchnorm") == default_sweep("batchnorm")
    assert {c.seed for c in default_sweep("batchnorm", seed=5)} == {5}


def test_syncbn_sweep_has_uneven_and_empty_rank_splits_in_every_dtype_and_layout():
    from normcheck.cases.sweep import SYNCBN_DTYPES, SYNCBN_SPLITS

    cases = default_sweep("syncbn")
    assert {(c.split, (c.dtype, c.param_dtype)) for c in cases} == set(product(SYNCBN_SPLITS, SYNCBN_DTYPES))
    assert {len(c.split) for c in cases} == {1, 2, 3, 4}
    empty = [c for c in cases if 0 in c.split]
    assert {c.split.index(0) == 0 for c in empty} == {True, False}  # empty first and elsewhere
    assert {c.x_format for c in empty} == {c.x_format for c in cases}
    assert any(len(set(c.split) - {0}) > 1 for c in cases)  # uneven
    # Some per-rank counts are not exactly representable in bf16 (8 significant bits).
    counts = {n * c.numel // (c.shape[0] * c.shape[1]) for c in cases for n in c.split}
    significant_bits = [n.bit_length() - (n & -n).bit_length() + 1 for n in counts if n]
    assert max(significant_bits) > 8


def test_layernorm_sweep_has_long_rows_long_reductions_and_multi_dim_shapes():
    cases = default_sweep("layernorm")
    hidden = {c.view.set_size for c in cases}
    rows = {c.view.channel_count for c in cases}  # the length of dγ's and dβ's sums
    assert max(hidden) >= 8192 and min(hidden) <= 8 and max(rows) >= 65536 and min(rows) <= 4
    assert {c.normalized_dims for c in cases} == {1, 2, 3}
    assert all(h & (h - 1) for h in hidden)  # no hidden size is a power of two (nor a block multiple)
