"""Meta-tests of the hypothesis strategies: every draw is a valid, cheap case; every axis is reachable."""
from math import prod

from hypothesis import given, settings
from hypothesis import strategies as st

from normcheck import OPS
from normcheck.numerics.formats import DY_ONLY, FORMATS
from normcheck.numerics.profiles import PROFILES
from normcheck.cases.strategies import MAX_NUMEL, cases


@given(st.sampled_from(list(OPS)).flatmap(cases))
def test_every_drawn_case_is_valid_and_cheap(case):
    case.validate()
    assert prod(case.shape) <= MAX_NUMEL + prod(case.shape) // max(case.shape)  # one bump allowed
    assert case.view.set_size >= case.record.min_set_size


def test_the_conventions_and_eps_none_are_drawn():
    seen = set()

    @settings(max_examples=200, derandomize=True, database=None)
    @given(cases("rmsnorm"))
    def collect(case):
        seen.update({("offset", case.weight_offset), ("casting", case.casting), ("eps", case.eps is None),
                     ("hidden", case.view.set_size == 1)})

    collect()
    assert {("offset", 0.0), ("offset", 1.0), ("casting", "end"), ("casting", "before-weight"), ("eps", True),
            ("hidden", True)} <= seen


def test_both_residual_streams_and_both_forms_are_drawn():
    seen = set()

    @settings(max_examples=30, derandomize=True, database=None)
    @given(cases("add_layernorm"))
    def collect(case):
        seen.update({("stream", case.residual_dtype), ("returns", case.returns)})

    collect()
    assert seen == {("stream", "input"), ("stream", "f32"), ("returns", "y,h"), ("returns", "y")}


def test_every_axis_is_reachable():
    seen = {"dtype": set(), "format": set(), "dy_format": set(), "profile": set(), "rank": set(), "mixed_layout": False}

    @settings(max_examples=300, derandomize=True, database=None)
    @given(cases("groupnorm"))
    def collect(case):
        seen["dtype"].add(case.dtypes.label)
        seen["format"].add(case.x_format)
        seen["dy_format"].add(case.dy_format)
        seen["profile"].add(case.profile)
        seen["rank"].add(len(case.shape))
        seen["mixed_layout"] |= case.x_format != case.dy_format

    collect()
    assert seen["dtype"] == {"f64", "f32", "f16", "bf16", "f16/f32", "bf16/f32"}
    assert seen["format"] == set(FORMATS) - set(DY_ONLY) and seen["dy_format"] == set(FORMATS)
    assert seen["profile"] == set(PROFILES)
    assert seen["rank"] == {2, 3, 4, 5}
    assert seen["mixed_layout"]


def test_each_op_field_is_drawn_as_its_declaration_says():
    # a field that declares a draw takes each of its values over some draws; one that declares none (the
    # implementation's to say: fp8 output, channels-first sets, who reduces) keeps the op's default
    for op in ("groupnorm", "add_rmsnorm", "layernorm_hp"):
        record, seen = OPS[op], {}

        @settings(max_examples=60, derandomize=True, database=None)
        @given(cases(op))
        def collect(case):
            for field in record.fields:
                seen.setdefault(field.name, set()).add(getattr(case, field.name))
                if field.draw is not None:
                    assert getattr(case, field.name) in field.candidates(case.shape, record)

        collect()
        for field in record.fields:
            if field.draw is None:
                assert seen[field.name] == {field.default}, (op, field.name)
            elif field.name != "groups":  # (groups: the divisors of each case's own C)
                assert seen[field.name] == set(field.candidates((2, 8, 8, 8), record)), (op, field.name)
        assert op != "groupnorm" or len(seen["groups"]) > 2
