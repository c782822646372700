"""The gated LayerNorm record (normcheck/ops/layernorm_gate.py) through the array contract: a JAX and a TensorFlow
textbook written here, (LayerNorm(x)·w + b)·silu(z) with the gate in the accumulation dtype, pass a slice of the
default sweep that takes every dtype, layout arrays express, profile and path; the same textbook with the bias
added after the gate fails it. (Its torch record, correct styles and mutants are judged by the template tests from
the record and tests/mutants/layernorm_gate.py.)"""
from __future__ import annotations

import pytest

from normcheck import compare, resolve_impl
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, MISTRUSTED, PASS
from normcheck.frameworks import FRAMEWORKS

from ._array_impls import _acc, _namespace, _silu, layer_norm

HERE = "tests.test_layernorm_gate"
COVERED = ("dtype", "param_dtype", "x_format", "profile", "affine", "frozen")


def _gated(framework, bias_after_gate=False):
    def gated(x, gate, weight, bias, *, axes, eps):
        xp = _namespace(framework)
        acc = _acc(xp, x)
        y = xp.asarray(layer_norm(framework, xp.asarray(x, acc), weight, None if bias_after_gate else bias, axes=axes,
                                  eps=eps), acc)
        y = y * _silu(xp, xp.asarray(gate, acc))
        if bias_after_gate and bias is not None:
            y = y + xp.asarray(bias, acc)
        return xp.asarray(y, x.dtype)
    return gated


jax_layer_norm_gate, tf_layer_norm_gate = _gated("jax"), _gated("tf")
jax_bias_after_gate = _gated("jax", bias_after_gate=True)


def _slice(impl):
    seen, chosen = set(), []
    for case in default_sweep("layernorm_gate", follows=impl.impl.follows, formats=impl.impl.formats,
                              narrowing=Narrowing(scans="without")):  # (the design's values; scans try sizes)
        new = {(name, getattr(case, name)) for name in COVERED} - seen
        if new:
            chosen.append(case)
            seen |= new
    return chosen


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_an_array_textbook_passes_a_slice_of_the_sweep_and_its_mutant_fails(framework):
    missing = FRAMEWORKS.missing(framework)
    if missing is not None:
        pytest.skip(str(missing))
    impl = resolve_impl("layernorm_gate", f"{HERE}:{framework}_layer_norm_gate", framework=framework)
    cases = _slice(impl)
    reports = [compare("layernorm_gate", impl, case) for case in cases]
    assert not [r.case.label for r in reports if r.verdict not in (PASS, MISTRUSTED)]
    assert len(cases) >= 6 and {c.affine for c in cases} >= {True, False}
    if framework == "jax":
        mutant = resolve_impl("layernorm_gate", f"{HERE}:jax_bias_after_gate", framework="jax")
        affine = [c for c in cases if c.affine is True]
        assert any(compare("layernorm_gate", mutant, c).verdict == FAIL for c in affine)
