"""The boundary scans (normcheck.ops.design.Scan, normcheck.cases.sweep.scan_rows): every size factor of every op is
scanned through the sizes around each power of two and three, five and seven times one, one case per size and dtype, every other
factor at its usual level; read back off the built cases, part of the default sweep, narrowed by the run's options."""
import io
import json

import pytest

from normcheck.cases.narrowing import Narrowing, option_fields
from normcheck.cases.sweep import case_of, default_sweep, factors, scan_rows
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.ops import OPS
from normcheck.ops.design import (SCAN_DTYPES, SCAN_ELEMENTS, boundary_sizes, scan_of, scan_sizes,
                                   scanned_in_every_dtype)


def test_the_shared_rule_is_every_power_of_two_and_three_five_and_seven_times_one_with_their_neighbours():
    sizes = boundary_sizes(1024)
    for width in ([2 ** j for j in range(1, 11)] + [3 * 2 ** j for j in range(1, 9)] + [5 * 2 ** j for j in range(1, 8)]
                  + [7 * 2 ** j for j in range(1, 8)]):
        assert {width - 1, width, width + 1} <= set(sizes), width
    assert 2049 not in sizes and 1536 not in sizes and 1280 not in sizes and 1792 not in sizes  # (past the limit)
    assert sizes == tuple(sorted(set(sizes))) and min(sizes) == 1 and boundary_sizes(1024, start=3)[0] == 3
    # (sizes on no boundary are the covering design's: 9·2^j, 11·2^j and primes between the boundaries)
    assert {18, 22, 100, 1000, 2 * 9 * 32} & set(sizes) == set()


@pytest.mark.parametrize("op", list(OPS))
def test_every_size_factor_is_scanned_and_each_case_reads_its_size_back(op):
    rows = scan_rows(op)
    scanned = {f.name for f in factors(op) if scan_of(f) is not None}
    assert scanned and {name for name, _, _ in rows} == scanned
    assert not scanned & {"rank", "dtype", "layout", "profile", "path", "eps", "momentum"}  # (sizes only)
    by_name = {f.name: f for f in factors(op)}
    sweep = set(default_sweep(op))
    for name, size, row in rows:
        case = case_of(op, row)
        read = scan_of(by_name[name]).read or by_name[name].read
        assert read(case) == size and case in sweep, (name, size)
        assert (case.dtype, case.param_dtype) in SCAN_DTYPES and (case.x_format, case.dy_format) == ("contiguous",) * 2
        assert case.profile == "normal" and case.numel <= SCAN_ELEMENTS
    for name in scanned:
        got = {size for n, size, _ in rows if n == name}
        # most of the rule's sizes make a case: the others are past SCAN_ELEMENTS even with small companions
        assert len(got) >= 0.6 * len(scan_sizes(by_name[name])), (name, sorted(got))
        # (in f64 and f32 on the boundaries of 2^j and 3·2^j; in f32 alone on those only 5·2^j and 7·2^j make)
        assert all([row["dtype"] for n, s, row in rows if (n, s) == (name, size)]
                   == (list(SCAN_DTYPES) if scanned_in_every_dtype(size) else [SCAN_DTYPES[-1]]) for size in got)
        assert any(not scanned_in_every_dtype(size) for size in got) or max(got) < 10


def test_the_scans_follow_the_declared_limits():
    layernorm, groupnorm = {f.name: f for f in factors("layernorm")}, {f.name: f for f in factors("groupnorm")}
    assert max(scan_sizes(layernorm["hidden"])) == 32769  # up to its largest level, 40009
    assert max(scan_sizes(groupnorm["batch"])) == 65 and max(scan_sizes(groupnorm["channels"])) == 1025
    groups = {size: case_of("groupnorm", row) for name, size, row in scan_rows("groupnorm") if name == "groups"}
    assert all(c.groups == g and c.channels == 2 * g for g, c in groups.items()) and {7, 96, 97} <= set(groups)


@pytest.mark.parametrize("op, narrowing, splits", [
    ("syncbn", Narrowing(), {n: (n, 1) for n in range(1, 8)}),  # (rank 0's share, up to the levels' largest)
    ("syncbn", Narrowing.of(world_size=3), {n: (n, 0, 6) for n in range(1, 8)}),  # (the usual split of 3 ranks)
    ("layernorm_hp", Narrowing(), {n: (n, 1) for n in (255, 256, 257, 511, 512, 513)}),
])
def test_a_split_is_scanned_through_rank_0s_share_beside_the_usual_others(op, narrowing, splits):
    got = {size: case_of(op, row, 0, narrowing).split for name, size, row in scan_rows(op, narrowing)
           if name == "split"}
    assert {n: got.get(n) for n in splits} == splits


def test_the_scans_come_after_the_covering_design_and_a_run_may_take_either_alone():
    full = default_sweep("batchnorm")
    design, scans = (default_sweep("batchnorm", narrowing=Narrowing(scans=part)) for part in ("without", "only"))
    assert full == design + [c for c in scans if c not in design] and len(full) > 2 * len(design)
    assert {(c.x_format, c.profile) for c in scans} == {("contiguous", "normal")}
    with pytest.raises(UsageError, match="scans must be one of with, without, only"):
        Narrowing.of(scans="some")


@pytest.mark.parametrize("options, dtypes, layouts", [
    ({"dtype": "bf16"}, {("bf16", "bf16")}, {("contiguous", "contiguous")}),
    ({"memory_format": "channels_last"}, {("f64", "f64"), ("f32", "f32")}, {("channels_last", "channels_last")}),
    ({"profile": "offset"}, {("f64", "f64"), ("f32", "f32")}, {("contiguous", "contiguous")}),
])
def test_the_runs_options_narrow_the_scans_as_they_narrow_the_rest(options, dtypes, layouts):
    narrowing = Narrowing.of(option_fields(**options))
    cases = [case_of("groupnorm", row, 0, narrowing) for _, _, row in scan_rows("groupnorm", narrowing)]
    assert len(cases) > 100
    assert {(c.dtype, c.param_dtype) for c in cases} == dtypes and {(c.x_format, c.dy_format) for c in cases} == layouts
    assert {c.profile for c in cases} == {options.get("profile", "normal")}


def test_a_run_that_fixes_a_size_has_no_scan_of_it():
    assert scan_rows("groupnorm", Narrowing.of(option_fields(shape=(2, 6, 5, 5)))) == ()
    assert "groups" not in {name for name, _, _ in scan_rows("groupnorm", Narrowing.of({"groups": 3}))}


def test_list_coverage_shows_the_scans_as_a_block_of_their_own():
    out = io.StringIO()
    assert main(["list", "--op", "layernorm", "--coverage"], out) == 0
    text = out.getvalue()
    block = text[text.index("boundary scans"):]
    assert "rows:" in block and "hidden:" in block and " 4095 4096 4097 " in block and "f64, f32" in block
    out = io.StringIO()
    assert main(["list", "--op", "layernorm", "--coverage", "--json", "--dtype", "f32"], out) == 0
    scans = {s["factor"]: s for s in json.loads(out.getvalue())["scans"]}
    assert set(scans) == {"rows", "hidden"} and scans["rows"]["dtypes"] == ["f32"]
    # (each scan's cases that are no earlier one's: hidden 16 at 2 rows is the rows scan's 2 rows at 16)
    f32 = option_fields(dtype="f32")
    added = len(default_sweep("layernorm", narrowing=Narrowing.of(f32))) - len(
        default_sweep("layernorm", narrowing=Narrowing.of(f32, scans="without")))
    assert scans["rows"]["cases"] + scans["hidden"]["cases"] == added and scans["hidden"]["cases"] >= 70
