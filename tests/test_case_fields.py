"""An op's own case fields are declared once by its record (ops.CaseField): Case's validation and labels, the
CLI's options and the pytest plugin's conventions follow from the declaration; add + norm's form that returns y
alone is one such field (returns=y), and the interface, the reference and the judgement follow it."""
from __future__ import annotations

import numpy as np
import pytest

from normcheck import OPS, Case, compare, resolve_impl
from normcheck.cases.case import CONVENTIONS, OP_FIELDS
from normcheck.cases.sweep import default_sweep
from normcheck.arguments import build_parser
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.engine import FAIL, PASS
from normcheck.ops import CASE_FIELDS
from tests.mutants import CATALOGUE


def a_value(field):
    """A value the field takes other than its default (of its type: 2.0 for a weight offset)."""
    return next((v for v in field.choices if v != field.default), None) or field.parse("2")


def test_every_declared_field_is_a_case_field_and_every_op_field_is_declared():
    assert set(OP_FIELDS) == set(CASE_FIELDS)
    assert all(set(op.case_fields) <= set(CASE_FIELDS) for op in OPS.values())
    assert {name for name in OP_FIELDS if CASE_FIELDS[name].convention} <= set(CONVENTIONS)


@pytest.mark.parametrize("name", OP_FIELDS)
def test_every_declared_field_is_a_cli_option_parsed_as_declared(name):
    field = CASE_FIELDS[name]
    value = a_value(field)
    args = build_parser().parse_args(["compare", "--op", "layernorm", f"--{field.option}", str(value)])
    assert getattr(args, name) == value and type(getattr(args, name)) is type(value)
    takers = [op.name for op in OPS.values() if name in op.case_fields]
    assert field.option in build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
    if field.choices:  # a value it does not take is one line naming those it does
        with pytest.raises(UsageError, match=f"unknown {field.option} 'nope'; choose one of"):
            build_parser().parse_args(["compare", "--op", takers[0], f"--{field.option}", "nope"])


def test_a_field_value_a_case_does_not_take_is_one_line():
    with pytest.raises(UsageError, match="unknown returns 'h'; choose one of y,h, y"):
        Case("add_rmsnorm", (4, 6), returns="h")
    with pytest.raises(UsageError, match="--returns applies to add_rmsnorm, add_layernorm, add_layernorm_sp and add_rmsnorm_sp only, not rmsnorm"):
        Case("rmsnorm", (4, 6), returns="y")


def test_a_label_shows_a_field_away_from_its_quiet_value_only():
    assert " returns=y " in f" {Case('add_rmsnorm', (4, 6), returns='y').label} "
    assert "returns" not in Case("add_rmsnorm", (4, 6)).label and Case("add_rmsnorm", (4, 6)).returns == "y,h"


@pytest.mark.parametrize("op", ["add_rmsnorm", "add_layernorm"])
def test_the_form_that_returns_y_alone_has_no_stream_and_dx_is_the_norms_gradient(op):
    both, alone = Case(op, (3, 4, 8), "f64"), Case(op, (3, 4, 8), "f64", returns="y")
    record = OPS[op]
    assert [r.name for r in record.results_of(both)] == ["h"] and record.results_of(alone) == ()
    assert "dh" not in alone.make_inputs().extra and "h" not in record.required_of(alone)
    with_dh, without = record.reference(both.make_inputs()), record.reference(alone.make_inputs())
    dh = both.make_inputs().extra["dh"]
    np.testing.assert_allclose(with_dh["dx"] - dh, without["dx"], rtol=0, atol=1e-12)


def test_a_kernel_returning_the_stream_where_the_case_says_y_alone_fails_its_interface():
    """The textbook's function that returns (y, h), given bare (no record declaring returns=y,h) and judged on a case
    that says y alone: the interface check says so."""
    fused = resolve_impl("add_rmsnorm", CATALOGUE["add_rmsnorm"].CORRECT["fused"].target)
    report = compare("add_rmsnorm", fused, Case("add_rmsnorm", (3, 8), "f32", returns="y"))
    assert report.verdict == FAIL and "y is tuple, expected a tensor" in report.summary()


def test_the_plugin_takes_any_declared_convention(pytester):
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "add_rmsnorm", "--normcheck-impl",
                                          "tests.mutants.add_rmsnorm:fused_y_only", "--normcheck-follows", "returns=y")
    sweep = [line for line in result.outlines if "::test_default_sweep[" in line]
    assert result.ret == 0 and len(sweep) == len(default_sweep("add_rmsnorm")) and all(" returns=y " in s for s in sweep)
    refused = pytester.runpytest_inprocess("--collect-only", "-q", "--normcheck-op", "add_rmsnorm",
                                           "--normcheck-follows", "stream=y")
    assert refused.ret != 0 and "--normcheck-follows 'stream=y': give NAME=VALUE" in "\n".join(refused.errlines)


def test_the_cli_judges_the_form_that_returns_y_alone(capsys):
    assert main(["compare", "--one-case", "--op", "add_layernorm", "--impl", "tests.mutants.add_layernorm:fused_y_only",
                 "--shape", "3,16", "--dtype", "bf16"]) == 0
    assert " returns=y " in capsys.readouterr().out
    assert main(["compare", "--op", "add_layernorm", "--impl", "torch", "--returns", "y"]) == 2
    assert "--returns y: torch follows returns=y,h" in capsys.readouterr().err
