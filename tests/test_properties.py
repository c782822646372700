"""Property suites: correct implementations agree with the reference on generated cases.

Profiles: `pytest --hypothesis-profile=dev` or `thorough` for more examples (see conftest.py).
Every failure message carries the `normcheck compare ...` line that replays the case.
"""
import pytest
from hypothesis import given

from normcheck import OPS, compare, resolve_impl
from normcheck.cases.strategies import cases
from normcheck.engine import FAIL
from normcheck.outputs.replay import report_replay as replay_command
from tests.mutants import CATALOGUE

# Every single-process op: torch's implementations (its record) and our correct ones in other styles.
IMPLS = [(op.name, impl.name) for op in OPS.values() if not op.distributed for impl in op.impls] + \
        [(op, fn) for op, module in CATALOGUE.items() if not OPS[op].distributed for fn in module.CORRECT.values()]


@pytest.mark.parametrize("op, impl", IMPLS, ids=lambda v: v if isinstance(v, str) else getattr(v, "name", None)
                         or v.__qualname__)
def test_correct_implementations_agree_with_reference(op, impl):
    impl = resolve_impl(op, impl)

    @given(cases(op))
    def check(case):
        report = compare(op, impl, case.with_(**dict(impl.impl.follows)))  # in the conventions it follows
        assert report.verdict != FAIL, f"{report.summary()}\n  replay: {replay_command(report)}"

    check()


@given(cases("groupnorm", profiles=["normal"]))
def test_gamma_outside_group_sums_is_caught_whenever_gamma_varies_in_a_group(case):
    # The property behind a mutant: it is wrong exactly when some group holds channels with different γ.
    case = case.with_(frozen="none", order=1 if case.order == "fwd" else case.order)  # (the property is about dx,
    # which forward mode does not compute)
    report = compare("groupnorm", CATALOGUE["groupnorm"].MUTANTS["gamma_outside_group_sums"], case)
    inputs = case.make_inputs()
    if inputs.weight is None or case.shape[1] == case.groups:
        assert report.verdict != FAIL
    elif case.dtype in ("f64", "f32") and report.tensor("dx").max_ratio <= 1:
        # γ varies by ≥ 1e-3 relative inside every multi-channel group with this generator.
        raise AssertionError(f"not caught: {replay_command(report)}")
