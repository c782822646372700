"""The default sweep is a pairwise covering design over the factors each op's record declares: every value
and every pair of values that is not excluded occurs, read off the cases themselves."""
import subprocess
import sys
from itertools import combinations, product

import pytest

from normcheck.cases.case import FROZEN
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import coverage, default_sweep, design, exclusions, factors, narrowed_design, triple_cases
from normcheck.cases.tokens import encode_case
from normcheck.numerics.formats import SIZE1_BASE, innermost_dim
from normcheck.ops import OPS, get_op
from normcheck.ops.design import CLASSES, REMAINDERS, shared_anchors

LARGEST_CASE = 1_200_000  # elements: a case stays well under a second


@pytest.mark.parametrize("op", list(OPS))
def test_every_declared_value_and_every_allowed_pair_is_covered(op):
    values, pairs = coverage(op)
    missing = [f"{name}={v}" for name, counts in values.items() for v, n in counts.items() if not n]
    missing += [f"{a}={va} × {b}={vb}" for (a, b), counts in pairs.items() for (va, vb), n in counts.items() if not n]
    assert not missing, missing[:8]
    assert set(values) == {f.name for f in factors(op)} and len(pairs) == len(factors(op)) * (len(factors(op)) - 1) // 2


def test_coverage_is_read_off_the_cases_and_can_fail():
    """Coverage counts what the cases hold, not what the plan says: a sweep laid out contiguous loses every other
    layout and its pairs."""
    cases = [c.with_(x_format="contiguous", dy_format="contiguous") for c in default_sweep("layernorm")]
    values, pairs = coverage("layernorm", cases)
    assert values["layout"][("contiguous", "contiguous")] == len(cases)
    assert values["layout"][("channels_last", "channels_last")] == 0
    assert 0 in pairs["dtype", "layout"].values() and 0 not in pairs["dtype", "profile"].values()


def _class_triples_missing(op: str, cases, narrowing: Narrowing = Narrowing()) -> list:
    """The triples of classes (ops.design.CLASSES of the levels the narrowed design keeps; the innermost extent's
    remainder by 16, 8, 4 and 2, computed here) that no case holds, each read off the cases."""
    fs = narrowed_design(op, narrowing)[0]
    table = {f.name: sorted({CLASSES[f.name](v) for v in f.values}) for f in fs if f.name in CLASSES}
    table["remainder"] = ["16", "8", "4", "2", "1"]

    def classes(c):
        read = {"dtype": (c.dtype, c.param_dtype), "layout": (c.x_format, c.dy_format), "path": (c.affine, c.frozen),
                "mode": c.mode}
        n = c.shape[innermost_dim(c.x_format, len(c.shape))]
        return {**{name: CLASSES[name](read[name]) for name in table if name != "remainder"},
                "remainder": next(str(w) for w in (16, 8, 4, 2, 1) if n % w == 0 and (w == 16 or n % (2 * w)))}

    held = {tuple(sorted(classes(c).items())) for c in cases}
    return [triple for names in combinations(table, 3) for triple in product(*[[(n, v) for v in table[n]] for n in names])
            if not any(set(triple) <= set(h) for h in held)]


@pytest.mark.parametrize("op", list(OPS))
def test_every_triple_of_the_classes_kernels_dispatch_on_is_a_case(op):
    """Paths chosen by three conditions at once (a half-only channels-last vector path with a tail, an eval-only one):
    every triple of the classes of dtype, layout, path, mode and the innermost extent's remainder by the vector widths
    is held by some case of the default sweep."""
    assert not _class_triples_missing(op, default_sweep(op))
    assert len(REMAINDERS) == 5 and {"dtype", "layout", "path"} <= set(CLASSES)


def test_the_class_triples_follow_the_runs_narrowing_and_their_count_can_fail():
    """Under --dtype f16 every remaining triple still has its case; the covering design's cases alone leave triples to
    chance (what the triple cases are for)."""
    narrowing = Narrowing.of({"dtype": "f16", "param_dtype": "f16"})
    assert not _class_triples_missing("batchnorm", default_sweep("batchnorm", narrowing=narrowing), narrowing)
    without = [c for c in default_sweep("batchnorm", narrowing=Narrowing(scans="without"))
               if c not in set(triple_cases("batchnorm"))]
    assert len(_class_triples_missing("batchnorm", without)) > 50


@pytest.mark.parametrize("op", list(OPS))
def test_size1_strides_are_swept_wherever_the_sweep_has_a_size1_dim(op):
    """Every op whose sweep makes a size-1 dim (a batch of one, one row, a spatial or hidden size of 1) has the
    layouts that give it a non-canonical stride, and each of them meets such a dim in some case (elsewhere they
    are their base layout exactly); an op whose shapes never have one has none of them."""
    cases = default_sweep(op)
    values, _ = coverage(op)
    size1 = [v for v in values["layout"] if set(v) & set(SIZE1_BASE)]
    if not any(1 in c.shape for c in cases):
        assert not size1
        return
    assert ("contiguous_size1", "contiguous_size1") in size1
    assert ("channels_last_size1", "contiguous") in size1 or 4 not in get_op(op).ranks or get_op(op).distributed
    for level in size1:
        assert any(1 in c.shape for c in cases if (c.x_format, c.dy_format) == level), level


@pytest.mark.parametrize("op", list(OPS))
def test_every_anchor_is_a_case_of_the_sweep_read_back_off_it(op):
    """Each op with a double backward has its higher orders in f64 and f32, with every input requiring grad, on
    normal data, in one case each (pairs alone meet those values in different cases)."""
    fs = factors(op)
    read = [{f.name: f.read(c) for f in fs} for c in default_sweep(op)]
    anchors = shared_anchors(get_op(op))
    assert bool(anchors) == get_op(op).double_backward
    for anchor in anchors:
        assert any(all(r[name] == value for name, value in anchor.values) for r in read), anchor.why


@pytest.mark.parametrize("op", list(OPS))
def test_every_exclusion_excludes_something_and_says_why(op):
    fs = {f.name: f for f in factors(op)}
    for e in exclusions(op):
        a, b = (fs[name] for name in e.factors)
        assert e.why and any(not e.allowed(va, vb) for va in a.values for vb in b.values), e.why
    assert all(level.why for f in fs.values() for level in f.levels)


@pytest.mark.parametrize("op", list(OPS))
def test_cases_are_small_and_shapes_vary(op):
    cases = default_sweep(op)
    assert max(c.numel for c in cases) <= LARGEST_CASE
    assert len({c.shape for c in cases}) >= len(cases) // 3  # not one shape per size class


@pytest.mark.parametrize("op", list(OPS))
def test_every_path_the_op_allows_is_in_its_sweep(op):
    """Every set of gradients it can be asked for (every output_mask of a native backward: each parameter alone,
    with and without dx, x or the parameters frozen), eval mode where it has running statistics and the double
    backward where it has one, those two in every dtype."""
    record, cases = get_op(op), default_sweep(op)
    # what can be asked for together: each parameter's gradient alone, and the data inputs' (x and an op's declared
    # data operands, frozen together) as one
    data = tuple(g for g, wrt in record.gradients.items() if wrt not in record.params)
    units = [data] + [(g,) for g, wrt in record.gradients.items() if wrt in record.params]
    masks = {tuple(sorted(sum(unit, ()))) for k in range(1, len(units) + 1) for unit in combinations(units, k)}
    assert {tuple(sorted(c.grads)) for c in cases} >= masks
    assert {c.frozen for c in cases} == set(FROZEN)
    dtypes = {c.dtypes for c in cases}
    assert {c.dtypes for c in cases if c.mode == "eval"} == (dtypes if record.running_stats else set())
    assert {c.dtypes for c in cases if c.order == 2} == (dtypes if record.double_backward else set())


def test_sweep_is_deterministic_across_processes_and_seeded(tmp_path):
    tokens = [encode_case(c) for c in default_sweep("groupnorm")]
    # (built there: no array in its cache, none shipped, so this also checks the one shipped here)
    code = "from normcheck.cases import covering; covering.SHIPPED = covering.SHIPPED / 'none'; " \
           "from normcheck.cases.sweep import default_sweep; from normcheck.cases.tokens import encode_case; " \
           "print(' '.join(encode_case(c) for c in default_sweep('groupnorm')))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": "", "NORMCHECK_CACHE": str(tmp_path)}).stdout.split()
    assert other == tokens
    assert {c.seed for c in default_sweep("batchnorm", seed=5)} == {5}
    assert [c.with_(seed=0) for c in default_sweep("batchnorm", seed=5)] == default_sweep("batchnorm")


def test_the_design_is_what_the_cases_are_built_from():
    """The covering design's rows, then the class triples' cases (scans aside)."""
    rows, cases = design("rmsnorm"), default_sweep("rmsnorm", narrowing=Narrowing(scans="without"))
    assert len(rows) + len(triple_cases("rmsnorm")) == len(cases) and cases[len(rows):] == list(triple_cases("rmsnorm"))
    for row, case in zip(rows, cases):
        assert {f.name: f.read(case) for f in factors("rmsnorm")} == row


def test_syncbn_splits_are_uneven_and_empty_in_every_dtype_and_layout():
    cases = default_sweep("syncbn")
    empty = [c for c in cases if 0 in c.split]
    assert {c.split.index(0) == 0 for c in empty} == {True, False}  # empty first and elsewhere
    assert {c.x_format for c in empty} == {c.x_format for c in cases}
    assert {c.dtypes for c in empty} == {c.dtypes for c in cases}
    # Some per-rank counts are not exactly representable in bf16 (8 significant bits).
    counts = {n * c.numel // (c.shape[0] * c.shape[1]) for c in cases for n in c.split}
    significant_bits = [n.bit_length() - (n & -n).bit_length() + 1 for n in counts if n]
    assert max(significant_bits) > 8


@pytest.mark.parametrize("op", OPS)
def test_a_hang_on_one_value_of_one_factor_never_looks_like_a_hang_on_every_case(op):
    # A run stops once its first STUCK_AFTER cases all timed out: those cases must not share a value of any factor,
    # or an implementation that hangs on that value alone (every f16 case, every eval case) would stop the run
    from normcheck.worlds.limits import STUCK_AFTER
    first = default_sweep(op)[:STUCK_AFTER]
    for factor in factors(op):
        assert len({repr(factor.read(case)) for case in first}) > 1, (op, factor.name)
