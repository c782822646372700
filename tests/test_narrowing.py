"""Every case option fixes its factor and the covering design covers the rest (normcheck.cases.narrowing): the
coverage is read back off the narrowed sweep's cases; a combination no case can take is one line; --one-case is the
explicit single case; the residual stream's dtype is a factor the default sweep covers; Triton's interpreter gets
smaller companions for the large levels, every level kept."""
import io
import json
from math import prod

import pytest

from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import coverage, default_sweep, factors, narrowed_design
from normcheck.cli import main
from normcheck.frameworks.torch.triton import INTERPRETER_ELEMENT_SCALE


def run(*argv):
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def covered(op: str, *options) -> dict:
    code, out = run("list", "--op", op, "--coverage", "--json", *options)
    assert code == 0, out
    return json.loads(out)


def values(doc: dict) -> dict:
    return {f["name"]: [v["value"] for v in f["values"]] for f in doc["factors"]}


@pytest.mark.parametrize("op, options, fixed", [
    ("layernorm", ["--normalized-dims", "1"], {"normalized_dims": ["1"]}),
    ("layernorm", ["--dtype", "f32"], {"dtype": ["f32/f32"]}),
    ("batchnorm", ["--memory-format", "channels_last"], {"layout": ["channels_last"], "rank": ["4"]}),
    ("groupnorm", ["--shape", "8,64,28,28"], {"rank": ["4"], "channels": ["64"], "spatial": ["784"], "batch": ["8"]}),
    ("rmsnorm", ["--dtype", "bf16", "--normalized-dims", "2", "--profile", "offset"],
     {"dtype": ["bf16/bf16"], "normalized_dims": ["2"], "profile": ["offset"]}),
    ("syncbn", ["--world-size", "3"], {"split": ["2,0,6", "0,3,5"]}),
])
def test_an_option_narrows_the_sweep_to_its_value_and_the_rest_stays_covered(op, options, fixed):
    doc = covered(op, *options)
    got = values(doc)
    assert {name: got[name] for name in fixed} == fixed
    assert doc["missing"] == [] and doc["cases"] > 10  # a sweep, not one case: every other value and pair covered
    full = {f.name: len(f.values) for f in factors(op)}
    free = [name for name in full if name not in fixed and full[name] > 1 and len(got[name]) > 1]
    assert len(free) >= 4, got  # the factors the options leave alone keep their levels


def test_the_narrowed_cases_read_the_options_back():
    code, out = run("compare", "--op", "layernorm", "--dtype", "f32", "--memory-format", "channels_last",
                    "--shape", "8,64,28,28", "--json")
    cases = [c["case"] for c in json.loads(out)["cases"]]
    assert code == 0 and len(cases) > 10
    assert {(tuple(c["shape"]), c["dtype"], c["x_format"]) for c in cases} == {((8, 64, 28, 28), "f32", "channels_last")}
    assert len({c["profile"] for c in cases}) > 3 and len({(c["affine"], c["frozen"]) for c in cases}) > 3


@pytest.mark.parametrize("size", [4, 16, 3])
def test_a_group_size_narrows_the_grouped_sweep_and_its_rows_stay_covered(size):
    # a count of groups no level makes (G = H / 4: 4, 256, ...; G = 1 where the group is the row) reads back as a level;
    # a size the usual row (16 values) does not take (3) keeps the rows that divide by it
    doc = covered("grouped_rmsnorm", "--group-size", str(size))
    assert doc["missing"] == [] and doc["cases"] > 10
    cases = default_sweep("grouped_rmsnorm", narrowing=Narrowing.of({"group_size": size}))
    assert {c.group_size for c in cases} == {size} and len({c.view.set_count for c in cases}) > 3


@pytest.mark.parametrize("options, message", [
    (["--affine", "none", "--frozen", "x"], "--frozen x with --affine none leaves nothing that requires grad"),
    (["--memory-format", "channels_last", "--shape", "4,3,5"], "channels_last needs a 4-D input, got a 3-D shape"),
    # (4 dims are a rank-5 case's; 5 would need a sixth dim)
    (["--normalized-dims", "5"], "must be (N, C) plus 0 to 3 spatial dims"),
])
def test_a_combination_no_case_can_take_is_one_line(options, message, capsys):
    assert main(["compare", "--op", "layernorm", *options]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_value_no_level_has_becomes_the_factors_one_level():
    fs, _ = narrowed_design("layernorm", Narrowing.of({"eps": 3e-4}))
    eps = next(f for f in fs if f.name == "eps")
    assert eps.values == (3e-4,) and all(c.eps == 3e-4 for c in default_sweep("layernorm", narrowing=Narrowing.of({"eps": 3e-4})))


def test_one_case_is_the_explicit_case():
    code, out = run("compare", "--one-case", "--op", "layernorm", "--normalized-dims", "1", "--dtype", "f32", "--json")
    cases = json.loads(out)["cases"]
    assert code == 0 and [c["case"]["shape"] for c in cases] == [[4, 6, 5, 5]]


def test_the_plugin_takes_the_same_narrowing(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "layernorm", "--normcheck-dtype",
                                          "f32", "--normcheck-normalized-dims", "1")
    sweep = [line for line in result.outlines if "::test_default_sweep[" in line]
    narrowed = default_sweep("layernorm", narrowing=Narrowing.of({"dtype": "f32", "param_dtype": "f32",
                                                                  "normalized_dims": 1}))
    assert result.ret == 0 and len(sweep) == len(narrowed) > 10
    assert all(" D=1 f32 " in line for line in sweep), sweep[:3]
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "layernorm", "--normcheck-dtype",
                                          "f32", "--normcheck-scans", "only")
    scans = default_sweep("layernorm", narrowing=Narrowing.of({"dtype": "f32", "param_dtype": "f32"}, scans="only"))
    collected = [line for line in result.outlines if "::test_default_sweep[" in line]
    assert result.ret == 0 and len(collected) == len(scans) > 100
    assert all(" f32 contiguous normal " in line for line in collected), collected[:3]


def test_the_default_sweep_of_add_and_norm_passes_both_residual_streams():
    for op in ("add_rmsnorm", "add_layernorm", "add_rmsnorm_sp"):
        streams = {(c.residual_dtype, c.dtype) for c in default_sweep(op)}
        assert {("f32", "bf16"), ("f32", "f16"), ("input", "bf16")} <= streams, op


def test_a_kernel_that_keeps_its_stream_in_f32_fails_the_sweep_and_passes_narrowed_to_it():
    spec = "tests._hint_layers:add_rms_norm_f32_stream"  # h always float32, whatever residual it is given
    code, out = run("compare", "--op", "add_rmsnorm", "--impl", spec, "--dtype", "bf16", "--maxfail", "1", "--no-hints")
    assert code == 1 and "h has dtype f32" in out
    code, out = run("compare", "--op", "add_rmsnorm", "--impl", spec, "--dtype", "bf16", "--residual-dtype", "f32",
                    "--scans", "without")  # (the stream's dtype is a factor of the design, not of the scans)
    assert code == 0, out


def test_triton_interpreter_cases_are_smaller_and_keep_every_level():
    narrowing = Narrowing(element_scale=INTERPRETER_ELEMENT_SCALE)
    for op in ("layernorm", "rmsnorm"):
        cases = default_sweep(op, narrowing=narrowing)
        levels, _ = coverage(op, cases, narrowing)
        assert all(n for counts in levels.values() for n in counts.values()), op
        assert {f.name: f.values for f in factors(op)} == {f.name: f.values for f in narrowed_design(op, narrowing)[0]}
        assert max(prod(c.shape) for c in cases) <= 100_000 < max(prod(c.shape) for c in default_sweep(op))
