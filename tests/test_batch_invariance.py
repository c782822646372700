"""--check batch-invariance (normcheck.engine.invariance): a case's rows run again in other batches must give the same
bits. Correct batch-invariant code passes, code whose reduction order follows the batch fails naming the row, the
batch and the ulps, torch's own batch variance is a known issue by signature, and ops whose rows depend on each
other say why they skip."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from normcheck import Case, compare, resolve_impl
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, KNOWN, PASS, SKIP
from normcheck.engine.invariance import Batch, batches, embedded
from normcheck.ops import layernorm, rmsnorm
from tests.mutants import CATALOGUE


def checked(op: str, impl):
    bound = resolve_impl(op, impl)
    return replace(bound, impl=replace(bound.impl, checks=("batch-invariance",)))


def test_the_batches_hold_the_cases_rows_where_they_say():
    case = Case("add_rmsnorm", (3, 8), "f32", dy_format="expanded")
    inputs = case.make_inputs()
    sizes = [b.size for b in batches(case)]  # its first row alone, among 5 more, and past 1024 rows (2M elements)
    assert sizes[:2] == [1, 8] and 1024 <= sizes[2] and sizes[2] * 8 <= 1 << 21
    big, big_inputs = embedded(case, inputs, Batch(8, 3, 3))
    assert big.shape == (8, 8) and np.array_equal(big_inputs.x[3:6], inputs.x)
    assert np.array_equal(big_inputs.extra["residual"][3:6], inputs.extra["residual"])
    assert np.array_equal(big_inputs.x[:3], inputs.x) and np.array_equal(big_inputs.x[6:], inputs.x[:2])  # in turn
    assert np.array_equal(big_inputs.dy, np.broadcast_to(inputs.dy[:1], (8, 8)))  # an expanded dy: one row for all
    assert np.array_equal(big_inputs.weight, inputs.weight)


def test_operands_follow_the_rows_where_their_declared_shape_does():
    case = Case("adaln", (3, 5, 8), "f32")  # scale and shift per sample: (N, 8)
    inputs = case.make_inputs()
    big, big_inputs = embedded(case, inputs, Batch(8, 3, 3))
    for name, operand in inputs.extra.items():
        assert big_inputs.extra[name].shape == (8,) + operand.shape[1:], name
        assert np.array_equal(big_inputs.extra[name][3:6], operand), name


@pytest.mark.parametrize("op", ["layernorm", "add_layernorm", "groupnorm"])
def test_batch_invariant_code_passes_the_check_on_a_slice_of_its_sweep(op):
    impl = checked(op, "torch")
    small = [c for c in default_sweep(op, follows=impl.impl.follows) if c.x_format == "contiguous" and c.numel <= 1 << 16]
    reports = [compare(op, impl, c) for c in small[::4][:5]]
    assert reports and all(r.verdict != FAIL for r in reports), [r.summary() for r in reports if r.verdict == FAIL]
    assert any(r.verdict == PASS for r in reports)


@pytest.mark.parametrize("op, fn, case", [
    ("layernorm", "tests._batch_variant:reversed_sums_from_64_rows", Case("layernorm", (7, 64), "f32")),
    ("rmsnorm", "tests._batch_variant:split_k_below_16_rows", Case("rmsnorm", (7, 33), "f64")),
])
def test_code_whose_reduction_follows_the_batch_fails_the_check_and_passes_without_it(op, fn, case):
    assert compare(op, resolve_impl(op, fn), case).verdict == PASS
    report = compare(op, checked(op, fn), case)
    assert report.verdict == FAIL and report.message.startswith("not batch invariant: "), report.message
    assert "ulps" in report.message and "batch of" in report.message


@pytest.mark.parametrize("op, fn", [("layernorm", "tests._batch_variant:reversed_sums_from_64_rows"),
                                    ("rmsnorm", "tests._batch_variant:split_k_below_16_rows")])
def test_the_default_sweep_under_the_check_catches_each_batch_variant_kernel(op, fn):
    impl = checked(op, fn)
    caught = next((r for r in (compare(op, impl, c) for c in default_sweep(op, follows=impl.impl.follows)
                               if c.numel <= 1 << 16) if r.verdict == FAIL), None)
    assert caught is not None and caught.message.startswith("not batch invariant"), caught and caught.message


def test_torchs_rms_norm_batch_variance_is_known_on_its_records_and_excuses_no_other_code():
    case = Case("rmsnorm", (7, 4097), "f64", x_format="strided")
    report = compare("rmsnorm", checked("rmsnorm", "torch"), case)
    assert report.verdict == KNOWN and rmsnorm.BATCH_VARIANCE.key in report.message, report.message
    # the same torch call given as a user's function is not excused: the issue is the record's, not a kernel's
    users = compare("rmsnorm", checked("rmsnorm", "normcheck.ops.rmsnorm:rms_norm"), case)
    assert users.verdict == FAIL and users.message.startswith("not batch invariant"), users.message


def test_torchs_layer_norm_half_fwd_rev_batch_variance_is_known_on_its_record_and_excuses_no_other_code():
    case = Case("layernorm", (1, 257, 17), "bf16", profile="exact", affine=False, order="fwd-rev", normalized_dims=1)
    report = compare("layernorm", checked("layernorm", "torch"), case)
    assert report.verdict == KNOWN and layernorm.HALF_FWD_REV_BATCH_VARIANCE.key in report.message, report.message
    users = compare("layernorm", checked("layernorm", "torch.nn.functional:layer_norm"), case)
    assert users.verdict == FAIL and users.message.startswith("not batch invariant"), users.message
    # first order, the same rows: invariant
    assert compare("layernorm", checked("layernorm", "torch"), replace(case, order=1)).verdict == PASS


@pytest.mark.parametrize("case, why", [
    (Case("batchnorm", (8, 3), "f32"), "training BatchNorm normalises by the batch's own statistics"),
    (Case("syncbn", (8, 3), "f32", split=(3, 5)), "the op's world splits one batch over its ranks"),
])
def test_ops_whose_rows_depend_on_each_other_skip_saying_why(case, why):
    distributed = case.record.distributed
    bound = resolve_impl(case.op, "torch19" if distributed else "torch", "lockstep" if distributed else None)
    impl = replace(bound, impl=replace(bound.impl, checks=("batch-invariance",)))
    report = compare(case.op, impl, case)
    assert report.verdict == SKIP and why in report.message, report.message
    assert compare("batchnorm", checked("batchnorm", "torch"), Case("batchnorm", (8, 3), "f32", mode="eval")).verdict \
        in (PASS, KNOWN)


def test_the_textbooks_of_the_catalogue_are_batch_invariant_on_contiguous_rows():
    fn = CATALOGUE["rmsnorm"].CORRECT["textbook"]
    bound = resolve_impl("rmsnorm", fn)
    impl = replace(bound, impl=replace(bound.impl, checks=("batch-invariance",)))
    assert compare("rmsnorm", impl, Case("rmsnorm", (5, 300), "f32")).verdict == PASS
