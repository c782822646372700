"""Templates over the op catalogue (OPS): every op's reference is right and its default sweep catches every mutant
in its catalogue (tests/mutants/); tests/test_impls.py judges the catalogue's correct implementations.

A new op record gets these tests for free; it must bring its mutant module.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings

from normcheck import OPS, Case, compare
from normcheck.cases.strategies import cases
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep, triple_cases
from normcheck.engine import FAIL
from tests.mutants import CATALOGUE, bound
from tests.mutants.textbook import BOUNDARY_BUGS, DISPATCH_BUGS

SWEEPS = {}


def sweep(op: str, follows=(), first: str | None = None):
    """The default sweep, under the conventions an implementation follows (Impl.follows); `first`: its boundary
    scans ("scans") or its class triples ("triples") before the rest (a mutant of one size path fails in its scan, one
    of a path three conditions choose in its triple: after every other case otherwise). Every case is run either way."""
    if (op, follows, first) not in SWEEPS:
        cases = default_sweep(op, follows=follows)
        if first is not None:
            part = set(triple_cases(op, Narrowing().with_fields(follows)) if first == "triples" else
                       set(cases) - set(default_sweep(op, follows=follows, narrowing=Narrowing(scans="without"))))
            cases = [c for c in cases if c in part] + [c for c in cases if c not in part]
        SWEEPS[op, follows, first] = cases
    return SWEEPS[op, follows, first]


def test_every_op_has_a_mutant_catalogue():
    assert set(CATALOGUE) == set(OPS)
    assert all(CATALOGUE[op].MUTANTS for op in OPS)


# ----------------------------------------------------------------------------- the reference

def _loss_terms(op, inputs) -> list[np.ndarray]:
    """The products summed into the loss: y·dy, and r·(its cotangent) for each differentiable result the case's op
    declares (add + norm's h with dh)."""
    out = op.reference(inputs)
    return [out["y"] * inputs.dy] + [out[r.name] * inputs.extra[r.cotangent]
                                     for r in op.results_of(inputs.case) if r.cotangent]


def _loss(op, inputs) -> float:
    """⟨y, dy⟩ + Σ ⟨r, its cotangent⟩."""
    return float(sum(np.sum(t) for t in _loss_terms(op, inputs)))


def _gain(record, inputs, eps: float) -> float:
    """How large a term of a gradient of the loss can be, per unit of the direction: a cotangent times a weight or
    operand (at least 1) times 1 + |x|, over √eps, the largest 1/σ a normalisation reaches; what the reference's own
    rounding of a gradient scales with, even where the gradient itself is all but 0 (a set of one value: x̂ = 0)."""
    def largest(arrays) -> float:
        return max((float(np.abs(a).max(initial=0.0)) for a in arrays), default=0.0)

    cotangents = [inputs.dy] + [inputs.extra[o.name] for o in record.operands_of(inputs.case) if o.role == "cotangent"]
    factors = [a for a in (inputs.weight, inputs.bias, *inputs.extra.values()) if a is not None]
    return largest(cotangents) * max(1.0, largest(factors)) * (1 + largest([inputs.x])) / np.sqrt(eps)


def _perturbed(inputs, name, value):
    """The inputs with one of them, x, a parameter or a declared operand, replaced."""
    if name in inputs.extra:
        return replace(inputs, extra={**inputs.extra, name: value})
    return replace(inputs, **{name: value})


def derivative_mismatches(record, inputs, grads: dict, seed: int) -> list[str]:
    """Each gradient ⟨d·, v⟩ against the central difference of the loss along a random v; the mismatches beyond what
    rounding can explain: the difference quotient's (the loss's terms, over the step) and the reference gradient's own
    (its terms, over the step's direction)."""
    # what rounding may move the loss: its terms' magnitudes, not its value (a loss that sums to about 0 does not
    # make its terms exact)
    terms = float(sum(np.abs(t).sum() for t in _loss_terms(record, inputs)))
    rng, mismatches = np.random.default_rng(seed % 1000), []
    for grad, name in record.gradients.items():
        value = inputs.extra[name] if name in inputs.extra else getattr(inputs, name)
        if value is None:
            continue
        v = rng.standard_normal(value.shape)
        h = 1e-5 * max(1.0, float(np.abs(value).max()))
        up, down, up2, down2 = (_loss(record, _perturbed(inputs, name, value + k * h * v)) for k in (1, -1, 2, -2))
        fd = (8 * (up - down) - (up2 - down2)) / (12 * h)  # fourth-order central difference: sets of 2 curve hard
        exact = float(np.sum(grads[grad] * v))
        scale = float(np.abs(grads[grad] * v).sum())
        roundoff = 2e-14 * terms / h  # what the difference quotient itself can resolve
        rounded = 1e-13 * float(np.abs(v).sum()) * _gain(record, inputs, inputs.case.eps_value)  # the gradient's own rounding
        if not abs(fd - exact) <= 1e-6 * scale + roundoff + rounded:
            mismatches.append(f"{inputs.case.label}: d{name}: {exact} vs finite difference {fd}")
    return mismatches


@pytest.mark.parametrize("op", list(OPS))
def test_reference_gradients_are_the_derivatives_of_its_forward(op):
    """⟨dx, v⟩ equals the central difference of ⟨y(x + h·v), dy⟩, and likewise for γ and β (it holds on fresh draws
    too: NORMCHECK_HYPOTHESIS_PROFILE=dev with several --hypothesis-seed values)."""
    record = OPS[op]

    @settings(max_examples=15, deadline=None)
    @given(cases(op, dtypes=["f64"], profiles=["normal", "heavy_tailed"], max_numel=600))
    def check(case):
        inputs = case.with_(eps=1e-3).make_inputs()
        assert derivative_mismatches(record, inputs, record.reference(inputs), case.seed) == []

    check()


def test_the_derivative_check_can_fail():
    """A reference whose dx dropped the x̂·mean(dy·x̂) term fails the check, with its allowance, on sets of 8 values;
    a dx off by 1e-6 where it is 0 (LayerNorm over sets of one value: x̂ = 0) fails it too."""
    record = OPS["batchnorm"]
    inputs = Case("batchnorm", (8, 3), "f64", eps=1e-3).make_inputs()
    grads = record.reference(inputs)
    xhat = (inputs.x - inputs.x.mean(0)) / np.sqrt(inputs.x.var(0) + 1e-3)
    dropped = xhat * (inputs.dy * xhat).mean(0) * inputs.weight / np.sqrt(inputs.x.var(0) + 1e-3)
    assert derivative_mismatches(record, inputs, grads, 0) == []
    assert _failing(derivative_mismatches(record, inputs, {**grads, "dx": grads["dx"] + dropped}, 0)) == ["x"]
    single = Case("layernorm", (4, 1), "f64", eps=1e-3, normalized_dims=1).make_inputs()
    grads = OPS["layernorm"].reference(single)
    assert derivative_mismatches(OPS["layernorm"], single, grads, 0) == []
    assert _failing(derivative_mismatches(OPS["layernorm"], single, {**grads, "dx": grads["dx"] + 1e-6}, 0)) == ["x"]


def _failing(mismatches: list[str]) -> list[str]:
    """The inputs whose gradients derivative_mismatches' lines name ("<case>: d<input>: ...")."""
    return [m.split(": d")[1].split(":")[0] for m in mismatches]


# ----------------------------------------------------------------------------- the mutant catalogue

MUTANTS = [(op, bug) for op in OPS for bug in CATALOGUE[op].MUTANTS]


@pytest.mark.parametrize("op, bug", MUTANTS, ids=[f"{op}-{bug}" for op, bug in MUTANTS])
def test_default_sweep_catches_mutant(op, bug):
    impl = bound(op, CATALOGUE[op].MUTANTS[bug])
    cases = sweep(op, impl.impl.follows, "scans" if bug in BOUNDARY_BUGS else "triples" if bug in DISPATCH_BUGS else None)
    caught = next((r for r in (compare(op, impl, case) for case in cases) if r.verdict == FAIL), None)
    assert caught is not None, f"{op} mutant {bug} passed the whole default sweep"
