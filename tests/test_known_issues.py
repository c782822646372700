"""Every recorded upstream issue reproduces on the torch it was recorded with, and is attributed.

If torch fixes one of these, the matching test fails: drop the record then (and celebrate).
"""
import pytest
import torch
import torch.nn.functional as F

from dataclasses import replace

from normcheck import Case, compare, get_op, resolve_impl
from normcheck.engine import FAIL, KNOWN, PASS
from normcheck.impls import IMPLS
from normcheck.ops import RECORDED_WITH_TORCH, Bound, batchnorm as bn, groupnorm as gn, instancenorm as inorm, layernorm as ln, syncbn
from normcheck.ops import scalenorm as sn
from normcheck.ops import Impl
from normcheck.ops.add_layernorm import add_layer_norm
from normcheck.ops.add_layernorm import OP as ADD_LAYERNORM
from normcheck.ops.fused import through_stages
from tests.mutants import CATALOGUE

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith(RECORDED_WITH_TORCH),
    reason=f"known issues were recorded with torch {RECORDED_WITH_TORCH}, this is {torch.__version__}",
)


# torch's entry points given as user code: a known issue follows torch's kernels into the code that calls them.
USER_BN = resolve_impl("batchnorm", F.batch_norm)
USER_GN = resolve_impl("groupnorm", F.group_norm)
USER_LN = resolve_impl("layernorm", F.layer_norm)
USER_SYNCBN = resolve_impl("syncbn", "torch.nn.modules._functions:SyncBatchNorm.apply")  # dies: no kernel record
USER_IN = resolve_impl("instancenorm", F.instance_norm)
NATIVE_GN = resolve_impl("groupnorm", "torch-native-backward")
USER_ADD_LN = resolve_impl("add_layernorm", add_layer_norm)
USER_SN = resolve_impl("scalenorm", sn.scale_norm)  # (F.normalize times the gain)
# 1-element f32 rows of |mean| ≫ std: torch's layer_norm gives dx 4 where it is exactly 0
ADD_LN_TINY_ROWS = Case("add_layernorm", (4, 1, 7, 7, 1), "f32", profile="offset", normalized_dims=1, seed=2)

IN_PITCHED_DY = Case("instancenorm", (3, 16, 23, 89), "f16", x_format="offset8", dy_format="pitched", profile="offset",
                     eps=1e-10, momentum=1.0)
IN_RUNNING_VAR_OVERFLOW = Case("instancenorm", (3, 65, 1, 7), "f16", x_format="contiguous_size1", profile="big", eps=0.0,
                               affine="weight", frozen="x")

WITNESSES = [
    (bn.MIXED_SLOW_PATH, "batchnorm", USER_BN,
     Case("batchnorm", (2, 3, 2, 2), "bf16", "f32", "contiguous", "channels_last"), "dbias"),
    (bn.F16_INTERMEDIATES, "batchnorm", USER_BN, Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset"), "dweight"),
    (bn.CHANNELS_LAST_F32_CANCELLATION, "batchnorm", USER_BN,
     Case("batchnorm", (16, 3, 4, 32, 32), "f32", x_format="channels_last_3d", profile="offset"), "dx"),
    (gn.CHANNELS_LAST_VARIANCE, "groupnorm", USER_GN,
     Case("groupnorm", (2, 8, 32, 64), "f32", x_format="channels_last", profile="offset", groups=2), "dx"),
    (gn.F16_OVERFLOW, "groupnorm", USER_GN, Case("groupnorm", (2, 8, 128, 128), "f16", profile="offset", groups=2),
     "dweight"),
    # Found by the covering sweeps: a negative variance (NaN), the create_graph composite overflowing in f16
    (gn.CHANNELS_LAST_VARIANCE, "groupnorm", USER_GN,
     Case("groupnorm", (2, 3, 3, 683), "f32", x_format="channels_last", dy_format="contiguous", profile="offset",
          groups=3, frozen="x", eps=0.0), "y"),
    (gn.CREATE_GRAPH_HALF_PARAM_GRADS, "groupnorm", USER_GN,
     Case("groupnorm", (3, 3, 16384), "f16", profile="offset", groups=3, order=2), "dx"),
    # Found by the covering sweep of issue 41: f64 near-constant sets, forward-over-reverse (y, dx and jvp_y fail)
    (gn.CHANNELS_LAST_VARIANCE, "groupnorm", USER_GN,
     Case("groupnorm", (1, 8, 23, 89), "f64", groups=8, x_format="channels_last", profile="near_constant",
          frozen="params", order="fwd-rev"), "dx"),
    (ln.HALF_PARAM_GRADS, "layernorm", USER_LN, Case("layernorm", (65537, 6), "bf16", "f32", normalized_dims=1),
     "dweight"),
    (ln.F16_RSTD_OVERFLOW, "layernorm", USER_LN, Case("layernorm", (4, 1), "f16", eps=1e-10, normalized_dims=1), "dx"),
    (ln.TINY_ROW_STATISTICS, "layernorm", USER_LN,
     Case("layernorm", (65537, 2), "f32", profile="offset", affine=False, normalized_dims=1), "dx"),
    # (found by --budget's search on torch's record: half input, the same float32 kernel, dx past f16's range)
    (ln.TINY_ROW_STATISTICS, "layernorm", USER_LN,
     Case("layernorm", (28672, 2), "f16", "f32", profile="offset", seed=1, normalized_dims=1), "dx"),
    # Found by the fused ops' calibration: the add + norm record's dresidual is the norm's dx plus dh, wrong alike
    (through_stages(ln.TINY_ROW_STATISTICS, ADD_LAYERNORM.stages), "add_layernorm", USER_ADD_LN, ADD_LN_TINY_ROWS, "dx"),
    (syncbn.EMPTY_RANK_HALF, "syncbn", USER_SYNCBN,
     Case("syncbn", (8, 3, 5, 7), "bf16", split=(3, 0, 5)), None),
    # InstanceNorm's issues come from how torch builds it (BatchNorm over repeated parameters), not from a
    # kernel of its own: they follow the BatchNorm kernels that construction runs (torch.nn.InstanceNorm2d has them).
    (inorm.BATCH_OF_ONE_DY_LAYOUT, "instancenorm", "torch", Case("instancenorm", (1, 3, 64, 65), "f64",
                                                                  x_format="channels_last"), "dx"),
    (inorm.PER_INSTANCE_PARAM_GRADS, "instancenorm", "torch",
     Case("instancenorm", (2, 3, 3, 3), "bf16", None, "contiguous", "channels_last", "offset"), "dbias"),
    (inorm.MIXED_NO_AFFINE_RUNNING_STATS, "instancenorm", "torch",
     Case("instancenorm", (4, 3, 7), "f16", "f32", profile="exact", affine=False), "running_var"),
    (inorm.HALF_STRIDED, "instancenorm", "torch",
     Case("instancenorm", (1, 4, 5, 5), "f16", x_format="strided", profile="offset"), "dx"),
    # Found by the budgeted search, the pitched layouts and the class triples of issue 59
    (ln.F64_ONE_VALUE_ROWS, "layernorm", USER_LN,
     Case("layernorm", (65537, 1), "f64", profile="offset", eps=1e-10, normalized_dims=1), "dx"),
    (inorm.HALF_STRIDED, "instancenorm", "torch",
     Case("instancenorm", (3, 1, 65537), "f16", x_format="pitched", profile="big", frozen="params"), "dx"),
    (bn.MIXED_SLOW_PATH, "batchnorm", USER_BN,
     Case("batchnorm", (2, 8, 32768), "f16", "f32", "contiguous", "pitched", "offset", affine="weight"), "dx"),
    (bn.F16_INVSTD_OVERFLOW, "batchnorm", USER_BN,
     Case("batchnorm", (2, 64), "f16", profile="exact", eps=1e-10, momentum=1.0, affine="bias"), "y"),
    (inorm.MIXED_STRIDED_PARAM_GRADS, "instancenorm", "torch",
     Case("instancenorm", (1, 6, 37), "bf16", "f32", x_format="strided"), "dbias"),
    (gn.BIAS_WITHOUT_WEIGHT, "groupnorm", USER_GN, Case("groupnorm", (2, 4, 5), "f64", groups=2, affine="bias"), None),
    (ln.MIXED_BIAS_WITHOUT_WEIGHT, "layernorm", USER_LN, Case("layernorm", (3, 8), "bf16", "f32", normalized_dims=1,
                                                               affine="bias"), None),
    (gn.NATIVE_DY_LAYOUT, "groupnorm", NATIVE_GN,
     Case("groupnorm", (5, 12, 30), "f64", None, "contiguous", "strided", "exact", groups=6), "dx"),
    # The paths beyond a training-mode first-order backward: a frozen input, the double backward.
    (gn.FROZEN_X_CHANNELS_LAST_CRASH, "groupnorm", USER_GN,
     Case("groupnorm", (2, 6, 2, 2), "f64", x_format="channels_last", groups=3, frozen="x"), None),
    (gn.CREATE_GRAPH_HALF_PARAM_GRADS, "groupnorm", USER_GN,
     Case("groupnorm", (2, 8, 256), "bf16", "f32", profile="offset", groups=2, order=2), "dbias"),
    (bn.HALF_DOUBLE_BACKWARD, "batchnorm", USER_BN, Case("batchnorm", (2, 3, 8, 8), "f16", profile="near_constant",
                                                        order=2), "d2x"),
    (bn.DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT, "batchnorm", USER_BN,
     Case("batchnorm", (4, 3, 5), "f64", affine="bias", order=2), None),
    (ln.HALF_DOUBLE_BACKWARD, "layernorm", USER_LN, Case("layernorm", (8, 64), "f16", profile="near_constant",
                                                        order=2, normalized_dims=1, affine=False), "d2x"),
    (ln.DOUBLE_BACKWARD_BIAS_WITHOUT_WEIGHT, "layernorm", USER_LN,
     Case("layernorm", (4, 6), "f64", affine="bias", order=2, normalized_dims=1), None),
    (inorm.MIXED_BIAS_WITHOUT_WEIGHT, "instancenorm", USER_IN,
     Case("instancenorm", (2, 3, 3, 3), "bf16", "f32", affine="bias"), None),
    (syncbn.BIAS_WITHOUT_WEIGHT, "syncbn", USER_SYNCBN, Case("syncbn", (5, 3, 4), "f32", split=(3, 2), affine="bias"),
     None),
    # Forward mode (order fwd, fwd-rev): torch's forward-AD formulas and the JVP of its backward
    (bn.JVP_MIXED_DTYPE, "batchnorm", USER_BN, Case("batchnorm", (4, 3, 5), "bf16", "f32", frozen="params", order="fwd"),
     None),
    (bn.HALF_FORWARD_AD, "batchnorm", USER_BN,
     Case("batchnorm", (2, 8, 1, 1), "f16", profile="near_constant", frozen="params", order="fwd"), "jvp_y"),
    (ln.JVP_MIXED_DTYPE, "layernorm", USER_LN, Case("layernorm", (3, 8), "f16", "f32", normalized_dims=1, frozen="params",
                                                    order="fwd"), None),
    (ln.HALF_FORWARD_AD, "layernorm", USER_LN, Case("layernorm", (7, 16), "f16", profile="tiny", normalized_dims=1,
                                                    order="fwd"), "jvp_y"),
    (gn.JVP_CHANNELS_LAST_VIEW, "groupnorm", USER_GN,
     Case("groupnorm", (2, 4, 3, 5), "f64", x_format="channels_last", groups=2, order="fwd"), None),
    (gn.FWD_REV_CANCELLATION, "groupnorm", USER_GN,
     Case("groupnorm", (2, 64), "f32", profile="offset", eps=0.01, frozen="params", groups=2, order="fwd-rev"),
     "jvp_dx"),
    (gn.JVP_MIXED_DTYPE, "groupnorm", USER_GN, Case("groupnorm", (2, 4, 6), "bf16", "f32", groups=2, frozen="params",
                                                  order="fwd"), None),
    # A zero row, which eps floors: F.normalize's double backward is NaN there
    (sn.ZERO_ROW_DOUBLE_BACKWARD, "scalenorm", USER_SN, Case("scalenorm", (4, 16), "f64", profile="near_constant",
                                                             order=2, normalized_dims=1), "d2x"),
    # Found by the covering sweep of issue 41: several normalised dims of a non-contiguous f32 x
    (sn.STRIDED_F32_SUM, "scalenorm", USER_SN, Case("scalenorm", (1, 3, 32, 64, 64), "f32", x_format="channels_last_3d",
                                                    profile="offset", frozen="x", normalized_dims=3), "y"),
    (gn.HALF_FORWARD_AD, "groupnorm", USER_GN, Case("groupnorm", (3, 1, 32, 64), "f16", profile="tiny", eps=1e-10,
                                                    affine="weight", frozen="x", groups=1, order="fwd"), "jvp_y"),
    # Size-1 dims at non-canonical strides (issue 41): torch's own records, in both modes; user code that calls
    # F.batch_norm on such a view fails (test_code_that_calls_batch_norm_on_odd_size1_strides_fails)
    (bn.SIZE1_STRIDES, "batchnorm", "torch",
     Case("batchnorm", (1, 8, 1, 3), "f64", x_format="channels_last_size1", dy_format="contiguous"), "dbias"),
    (bn.SIZE1_STRIDES, "batchnorm", "torch",
     Case("batchnorm", (1, 8, 1, 3), "f64", x_format="channels_last_size1", dy_format="contiguous", mode="eval"), "dx"),
    (bn.SIZE1_STRIDES, "batchnorm", "torch",
     Case("batchnorm", (2, 8, 1, 3), "f32", x_format="channels_last_size1", dy_format="contiguous"), "dx"),
    (inorm.BATCH_OF_ONE_DY_LAYOUT, "instancenorm", "torch",
     Case("instancenorm", (1, 8, 1, 3), "f64", x_format="contiguous", dy_format="channels_last_size1"), "dbias"),
    # torch.nn.InstanceNorm2d's two FAILs of its default sweep (issue 62), torch's own record failing them alike: a
    # pitched (or 4-D transposed) dy at any N and C; an f16 running variance whose per-instance update overflows
    (inorm.HALF_STRIDED, "instancenorm", "torch", IN_PITCHED_DY, "dx"),
    (inorm.HALF_STRIDED, "instancenorm", "torch",
     Case("instancenorm", (2, 3, 4, 5, 6), "f16", x_format="contiguous", dy_format="transposed", profile="offset"), "dx"),
    (inorm.MIXED_HALF_STRIDED_DX, "instancenorm", "torch",
     Case("instancenorm", (3, 2, 23, 89), "f16", "f32", "contiguous", "pitched", "offset"), "dx"),
    (inorm.PER_INSTANCE_RUNNING_STATS, "instancenorm", "torch", IN_RUNNING_VAR_OVERFLOW, "running_var"),
]


@pytest.mark.parametrize("issue, op, code, case, tensor", WITNESSES, ids=[w[0].key for w in WITNESSES])
def test_issue_reproduces_and_is_attributed(issue, op, code, case, tensor):
    assert issue.applies(case)
    report = compare(op, code, case)
    if tensor is None and _kernel_record_comes_back(issue, op):  # the kernel raised or died: the kernels it ran are
        # known (a dead worker's from its journal)
        assert report.verdict == KNOWN and report.message.startswith(f"known issue {issue.key}")
    elif tensor is None:  # a rank's code: no record of which kernels ran, so no issue is named
        assert report.verdict == FAIL and "known issue" not in report.message
        if op == "syncbn":  # our recipe in torch's style has neither issue
            assert compare(op, resolve_impl(op, "torch19", "gloo"), case).verdict != FAIL
    else:  # the failure is real (the tensor fails, far over budget) and its signature is the issue's
        assert report.verdict == KNOWN and issue.key in report.message.split(":")[0].split(", ")[0][12:]
        assert report.worst.name == tensor and report.worst.verdict == FAIL and report.worst.max_ratio > 10
    registered = [resolve_impl(op, i) for i in IMPLS[op].values() if issue in i.known_issues]
    registered = [i for i in registered if i.unsupported(case) is None]
    assert registered
    for impl in registered:  # every registered implementation that takes the case attributes it
        report = compare(op, impl, case)
        assert report.verdict == KNOWN and report.message.startswith("known issue ") and issue.key in report.message


def test_an_inner_norms_issue_reaches_the_residual_gradient_of_its_add_norm_record():
    """torch-ln-tiny-row-statistics in add + LayerNorm: dx and dresidual are both dh plus torch's wrong norm
    gradient of h (4 for 0), so the record's issue names both; the textbook composite passes the case."""
    report = compare("add_layernorm", "torch", ADD_LN_TINY_ROWS)
    assert report.verdict == KNOWN and ln.TINY_ROW_STATISTICS.key in report.message
    assert {t.name for t in report.tensors if t.verdict == FAIL} == {"dx", "dresidual"}
    assert compare("add_layernorm", CATALOGUE["add_layernorm"].CORRECT["composed"], ADD_LN_TINY_ROWS).verdict != FAIL


def _kernel_record_comes_back(issue, op: str) -> bool:
    """The user code's run records the aten ops it called up to the raise or its process's death: one process."""
    return bool(issue.code) and not get_op(op).distributed


def test_a_hand_written_kernel_is_never_told_a_torch_issue_it_does_not_run():
    """A LayerNorm that sums dγ/dβ in bf16 itself fails where torch-ln-half-param-grads' signature would explain
    it; it never ran aten.native_layer_norm_backward, so the issue is not named (torch's own record, same case:
    KNOWN)."""
    from tests.mutants.layernorm import low_precision_param_sums

    case = Case("layernorm", (65537, 6), "bf16", "f32", normalized_dims=1)
    report = compare("layernorm", low_precision_param_sums, case)
    assert report.verdict == FAIL and report.worst.name in ("dweight", "dbias")
    assert "known issue" not in report.message and "torch-ln" not in report.message
    assert compare("layernorm", "torch", case).verdict == KNOWN


@pytest.mark.parametrize("impl, case", [
    ("tests._wrapping_impls:detached_input", Case("batchnorm", (2, 3, 2, 2), "f32", x_format="channels_last")),
    ("tests._wrapping_impls:f16_dx_plus_dy", Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset")),
    ("tests._wrapping_impls:f16_dx_plus_dy", Case("batchnorm", (8, 3, 32, 32), "f16", x_format="channels_last")),
], ids=["dx-zero-channels-last-f32", "f16-dx-plus-dy-offset", "f16-dx-plus-dy-channels-last"])
def test_a_bug_of_code_that_calls_torch_is_not_excused_by_torchs_known_issue(impl, case):
    """Code that calls F.batch_norm and breaks the result fails where a known issue of F.batch_norm's kernels would
    have explained it by signature: torch's own record, run on the case, does not fail it alike."""
    report = compare("batchnorm", impl, case)
    assert report.verdict == FAIL and "known issue torch-bn-" in report.message  # (named as what it resembles)
    assert compare("batchnorm", "torch", case).verdict != FAIL
    if compare("batchnorm", "torch", case).verdict == PASS:  # then its signature would have excused it: says why not
        assert "does not reproduce it on this case" in report.message and "budgets from torch's output" in report.message


def test_code_that_reproduces_torchs_issue_exactly_is_known_and_says_torch_fails_alike():
    case = Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset")
    report = compare("batchnorm", USER_BN, case)
    assert report.verdict == KNOWN and report.message.startswith("known issue torch-bn-f16-intermediates")
    assert report.message.endswith("(torch's own `torch` record fails this case alike)")


def f32_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch's LayerNorm computed in float32, y returned so (declared: --compute-dtype f32 --output-dtype promote)."""
    return F.layer_norm(input.float(), normalized_shape, None if weight is None else weight.float(),
                        None if bias is None else bias.float(), eps)


# diffusers' FP32LayerNorm's one FAIL of 698 (issue 62): float64 rows of two values 3.3e-5 apart at 4991, one value in
# float32, where torch's f32 layer_norm backward gives dx [0, −1024] for ±142.05 (float32 two-pass: ±142.05)
F64_ROWS_IN_F32 = Case("layernorm", (65537, 2), "f64", profile="offset", affine=False, normalized_dims=1,
                       compute_dtype="f32")


def test_a_torch_issue_of_the_precision_the_code_computes_in_is_known_there():
    """Code declaring --compute-dtype f32 on float64 input runs torch's f32 kernels (F.layer_norm on x.float()): their
    issue (torch-ln-tiny-row-statistics, recorded for f32) explains its failure, as torch's own record shows on the
    case's inputs rounded to f32. Code that breaks the result is not excused, and none of it reaches the case itself."""
    report = compare("layernorm", "tests._layer_classes:Float32LayerNorm", F64_ROWS_IN_F32)
    assert report.verdict == KNOWN, report.summary()
    assert report.message.startswith("known issue torch-ln-tiny-row-statistics: dx")
    assert report.message.endswith("(torch's own `torch` record fails this case alike in f32, the precision this code "
                                   "computes in)")
    assert compare("layernorm", "torch", F64_ROWS_IN_F32).verdict != FAIL  # (torch's f64 kernel: right)
    # where torch's f32 kernel is right (rows of |mean| ~ std), a tripled dx resembles the issue and is not it
    broken = compare("layernorm", "tests._layer_classes:BrokenGradientFloat32LayerNorm",
                     F64_ROWS_IN_F32.with_(profile="normal"))
    assert broken.verdict == FAIL and "resembles known issue torch-ln-tiny-row-statistics" in broken.message
    assert "does not reproduce it on this case in f32: dx is" in broken.message, broken.message
    # judged as computing in float64, the code's float32 is its own: no issue of torch's f32 kernel is named
    undeclared = compare("layernorm", "tests._layer_classes:Float32LayerNorm", F64_ROWS_IN_F32.with_(compute_dtype="f64"))
    assert undeclared.verdict == FAIL and "known issue" not in undeclared.message, undeclared.message


def test_a_torch_issue_that_half_input_code_meets_in_its_float32_kernels_is_known_there():
    """An f16 input with f32 parameters, code declaring --compute-dtype f32 (F.layer_norm on x.float(), as diffusers'
    FP32LayerNorm): torch's f32 double backward raises with a bias and no weight, where torch's own record on the f16
    case raises something else; its f32 record, on the case's inputs in f32, raises alike (found by --budget's search,
    a FAIL that named the issue it resembled). Code that declares nothing of its precision is not excused."""
    case = Case("layernorm", (1, 1), "f16", "f32", affine="bias", order=2, normalized_dims=1, compute_dtype="f32")
    report = compare("layernorm", "tests._real_layers:fp32_layer_norm", case)
    assert report.verdict == KNOWN, report.summary()
    assert report.message.startswith("known issue torch-ln-double-backward-bias-without-weight: raised")
    assert report.message.endswith("alike in f32, the precision this code computes in)"), report.message
    undeclared = compare("layernorm", "tests._real_layers:fp32_layer_norm", case.with_(compute_dtype="f64"))
    assert undeclared.verdict == FAIL, undeclared.summary()


def test_of_two_issues_that_explain_a_failure_the_one_torch_reproduces_makes_it_known():
    """One-value rows of float64 offset data in code computing in f32: torch-ln-f64-one-value-rows (the case's own
    precision) explains dx's shape of failure but torch's f64 record is right there; torch-ln-tiny-row-statistics (f32,
    the precision the code computes in) is reproduced by torch's f32 record (found by --budget's search: a FAIL that
    named only the first, 1.7e4 budgets from torch's f64 output)."""
    case = Case("layernorm", (864, 1), "f64", profile="offset", normalized_dims=1, compute_dtype="f32")
    report = compare("layernorm", "tests._real_layers:fp32_layer_norm", case)
    assert report.verdict == KNOWN, report.summary()
    keys = report.message.split(":")[0].removeprefix("known issue ").split(", ")
    assert "torch-ln-tiny-row-statistics" in keys and report.message.endswith("alike in f32, the precision this code "
                                                                                "computes in)"), report.message


# timm's LayerNorm2d's FAILs declared --normalized-at channels (issue 62): 54 of 685, each a torch issue its
# F.layer_norm on the permuted input met, which torch's record, run on the trailing sets, could not be compared with
CHANNELS_FIRST_HALF = Case("layernorm", (4, 1025, 8, 8), "f16", profile="tiny", eps=0.0, frozen="x",
                           normalized_at="channels")


def test_a_torch_issue_met_by_channels_first_code_is_known_on_the_same_sets_moved_last():
    """Channels-first code built on torch's kernel (timm's LayerNorm2d permutes to channels-last around F.layer_norm)
    meets torch's issues on the same sets: torch's record, which normalises the last dims, runs them moved last and
    fails alike (its dbias in f16, torch-ln-half-param-grads). A tripled dbias resembles the issue and is not it."""
    report = compare("layernorm", "tests._layer_classes:PermutedLayerNorm2d", CHANNELS_FIRST_HALF)
    assert report.verdict == KNOWN and report.message.startswith("known issue torch-ln-half-param-grads: dbias"), \
        report.summary()
    broken = compare("layernorm", "tests._layer_classes:BrokenBiasGradientLayerNorm2d", CHANNELS_FIRST_HALF)
    assert broken.verdict == FAIL and "does not reproduce it on this case: dbias is" in broken.message, broken.message


# timm's LayerNorm2d's two FAILs left declared --normalized-at channels (issue 62): forward-over-reverse of mixed input
CHANNELS_FIRST_FWD_REV = Case("layernorm", (1, 512, 2, 3), "bf16", "f32", profile="offset", eps=1e-10, order="fwd-rev",
                              normalized_at="channels")


def test_a_failure_of_values_is_reproduced_by_torchs_values_whatever_dtype_its_other_outputs_come_back_in():
    """timm's LayerNorm2d at fwd-rev on bf16 x with float32 γ: F.layer_norm's differentiable backward sums dβ in bf16
    (torch-ln-half-forward-ad: 2080 for 2075), and torch's record on the same sets moved last returns the same bits.
    (y's tangent may come back float32 from torch's record, torch-ln-jvp-mixed-dtype, and in bf16 from timm's, whose
    permute back casts it.) A row that failed by its values is reproduced by torch's values, its outputs' dtypes
    unchecked: KNOWN; a tripled dβ (3.2e6 budgets off) is FAIL."""
    report = compare("layernorm", "tests._layer_classes:PermutedLayerNorm2d", CHANNELS_FIRST_FWD_REV)
    keys, _, worst = report.message.removeprefix("known issue ").partition(": ")
    assert report.verdict == KNOWN and "torch-ln-half-forward-ad" in keys.split(", ") and worst.startswith("dbias"), \
        report.summary()
    broken = compare("layernorm", "tests._layer_classes:BrokenBiasGradientLayerNorm2d", CHANNELS_FIRST_FWD_REV)
    assert broken.verdict == FAIL and broken.message.startswith("dbias"), broken.message


@pytest.mark.parametrize("case, issue, tensor, right", [
    (IN_PITCHED_DY, inorm.HALF_STRIDED, "dx", IN_PITCHED_DY.with_(dy_format="contiguous")),
    (IN_RUNNING_VAR_OVERFLOW, inorm.PER_INSTANCE_RUNNING_STATS, "running_var", IN_RUNNING_VAR_OVERFLOW.with_(param_dtype="f32")),
], ids=["pitched-dy", "running-var-overflow"])
def test_instance_norm_2d_meets_torchs_instance_norm_issues_where_torch_fails_alike(case, issue, tensor, right):
    """torch.nn.InstanceNorm2d's default sweep failed these two cases (issue 62): torch's own kernels, not the class.
    The same values are right with a contiguous dy (a pitched one: dx inf for -0.0024) and with f32 running
    statistics (f16 ones: running_var inf for 52215.4)."""
    report = compare("instancenorm", "torch.nn:InstanceNorm2d", case)
    assert report.verdict == KNOWN and report.message.startswith(f"known issue {issue.key}"), report.summary()
    assert report.message.endswith("(torch's own `torch` record fails this case alike)")
    assert report.tensor(tensor).verdict == FAIL and report.tensor(tensor).nonfinite_mismatches
    assert compare("instancenorm", "torch.nn:InstanceNorm2d", right).tensor(tensor).verdict != FAIL


def test_a_torch_issue_met_through_declared_conventions_is_checked_against_torch_under_its_own():
    """torch's record is run on the case as torch is judged (its own conventions): the code's --output-dtype promote
    says nothing of torch's kernel. Its reproduction once failed on y's dtype ('y has dtype f16, expected f32'). On
    the f16 case torch's record raises another of its issues (mixed precision with a bias alone); in f32, the
    precision this code computes in, it raises alike, and the row says so."""
    impl = Impl("f32", "layernorm", "test code", f32_layer_norm, follows={"output_dtype": "promote", "compute_dtype": "f32"})
    case = Case("layernorm", (16, 16, 1, 2), "f16", "f32", normalized_dims=2, affine="bias", frozen="x", order=2,
                output_dtype="promote", compute_dtype="f32")
    report = compare("layernorm", impl, case)
    assert report.verdict == KNOWN and "torch-ln-double-backward-bias-without-weight" in report.message
    assert "has dtype" not in report.message and report.message.endswith("alike in f32, the precision this code "
                                                                          "computes in)"), report.message
    assert "raised raised" not in report.message


def test_torch_code_that_raises_in_a_kernel_with_a_known_issue_is_known_by_the_kernel_it_ran():
    def calls_native_backward(input, num_groups, weight=None, bias=None, eps=1e-5):
        return F.group_norm(input, num_groups, weight, bias, eps)  # raises in aten.native_group_norm_backward

    case = Case("groupnorm", (2, 4, 5), "f64", groups=2, affine="bias")
    assert compare("groupnorm", calls_native_backward, case).verdict == KNOWN

    def raises_itself(input, num_groups, weight=None, bias=None, eps=1e-5):
        raise RuntimeError("tensor does not have a device")  # the issue's message, but no torch kernel ran

    report = compare("groupnorm", raises_itself, case)
    assert report.verdict == FAIL and "known issue" not in report.message


def off_in_y(input, running_mean, running_var, weight, bias, training, momentum, eps):
    """torch's batch_norm, then y shifted by 0.25: a bug of this code, not of torch's kernels."""
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps) + 0.25


def test_a_failure_outside_the_signature_stays_a_failure_and_names_the_issue_it_was_near():
    case = Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset")  # torch-bn-f16-intermediates applies
    report = compare("batchnorm", off_in_y, case)
    assert report.verdict == FAIL
    assert "near known issue torch-bn-f16-intermediates, which does not explain y" in report.message


def test_an_unrelated_failure_of_torchs_own_code_is_not_hidden():
    # the same record, its known issue applying to the case, but the run raises something else
    def raising(case, t):
        raise RuntimeError("a new regression")

    impl = resolve_impl("batchnorm", replace(IMPLS["batchnorm"]["torch-native-backward"], target=raising))
    report = compare("batchnorm", impl, Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset"))
    assert report.verdict == FAIL and report.message.startswith("raised RuntimeError: a new regression")
    assert "near known issue torch-bn-f16-intermediates, which does not explain its message" in report.message


def test_known_issues_do_not_cover_the_plain_cases():
    plain = Case("groupnorm", (2, 8, 32, 64), "f32", groups=2, profile="offset")
    for impl in IMPLS["groupnorm"].values():
        if impl.framework == "torch":  # (flax's fast variance is wrong on any set with |mean| ≫ std)
            assert impl.applicable_issues(plain) == []
    assert compare("groupnorm", "torch", plain).verdict != KNOWN


def test_an_out_of_bounds_read_of_an_expanded_dy_explains_other_bits_or_a_crash_of_that_case_only():
    # aten.native_group_norm_backward reads an expanded dy (one sample's storage) as if laid out like x: what it
    # reads past the storage's end changes between runs (seen in the gate: 2x8x2048 f32 sliced:expanded), and
    # where nothing is mapped there the process dies (seen in CI: 3x65x2047 bf16 sliced:expanded). Which of the two
    # happens depends on the process's memory map, so the messages are what can be tested here.
    overread = gn.NATIVE_EXPANDED_DY_OVERREAD
    rerun = ("not deterministic: a second run on the same inputs gave other bits for dweight (an Impl record may "
             "declare deterministic=False)")
    crash = "died (exit code -11, SIGSEGV)"
    for message in (rerun, crash):
        assert overread.signature.explains_message(message)
        assert not gn.NATIVE_DY_LAYOUT.signature.explains_message(message)  # a layout's wrong values never crash
    assert not overread.signature.explains_message(rerun.replace("for dweight", "for y"))
    assert not overread.signature.explains_message("died (exit code -6, SIGABRT)")
    expanded = Case("groupnorm", (2, 8, 2048), "f32", groups=2, x_format="sliced", dy_format="expanded")
    channels_last_dy = Case("groupnorm", (2, 8, 4, 4), "f32", groups=2, dy_format="channels_last")
    assert overread.applies(expanded) and gn.NATIVE_DY_LAYOUT.applies(expanded)
    # a dy in another layout lies within its storage: its reads are wrong, never out of bounds
    assert gn.NATIVE_DY_LAYOUT.applies(channels_last_dy) and not overread.applies(channels_last_dy)


def test_the_direct_record_dying_of_sigsegv_is_known_on_an_expanded_dy_only():
    """torch's direct record in a worker process that dies as it did in CI: KNOWN where dy is expanded, a FAIL on
    the same case with dy laid out like x (no issue reads past a storage there)."""
    dies = resolve_impl("groupnorm", replace(IMPLS["groupnorm"]["torch-native-backward"],
                                             target="tests._solo_faults:segfaults"))
    expanded = Case("groupnorm", (2, 8, 64), "f32", groups=2, x_format="sliced", dy_format="expanded")
    report = compare("groupnorm", dies, expanded)
    assert report.verdict == KNOWN and "torch-gn-native-expanded-dy-overread" in report.message, report.message
    report = compare("groupnorm", dies, expanded.with_(dy_format="sliced"))
    assert report.verdict == FAIL and "SIGSEGV" in report.message, report.message


def test_a_known_issue_covers_the_kernels_of_the_devices_it_was_found_on_only():
    """torch's CPU and CUDA kernels are different code: an issue recorded on CPU never explains a failure of the same
    record bound to another device (a CUDA failure there is a finding to record, not to excuse)."""
    torch_ln = get_op("layernorm").impls[0]
    issue = ln.HALF_PARAM_GRADS
    case = next(c for c in (Case("layernorm", (4096, 8), "bf16", "f32", normalized_dims=1, seed=s) for s in range(3))
                if issue.applies(c))
    assert issue in Bound(torch_ln, "isolated", device="cpu").applicable_issues(case)
    assert issue in Bound(torch_ln, "isolated", device="cpu:0").applicable_issues(case)
    assert issue not in Bound(torch_ln, "isolated", device="cuda").applicable_issues(case)
    assert issue not in Bound(torch_ln, "isolated", device="cuda:1").applicable_issues(case)
    on_both = replace(issue, devices=("cpu", "cuda"))
    assert on_both in Bound(replace(torch_ln, known_issues=(on_both,)), "isolated", device="cuda:1") \
        .applicable_issues(case)


# ----------------------------------------------------------------------------- size-1 dims at non-canonical strides
def _odd_channels_last(shape, strides, seed):
    """A channels-last f64 tensor of `shape` whose size-1 dims have `strides`' odd ones, and its contiguous copy."""
    plain = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    odd = torch.empty_strided(shape, strides, dtype=torch.float64).copy_(plain)
    assert odd.is_contiguous(memory_format=torch.channels_last) and not odd.is_contiguous()
    return odd, plain


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape, strides", [((1, 8, 1, 3), (1, 1, 1, 8)), ((1, 8, 4, 4), (5, 1, 32, 8)),
                                            ((2, 8, 1, 3), (24, 1, 5, 8))])
def test_torch_batch_norm_reads_dy_in_the_wrong_layout_on_odd_size1_strides(training, shape, strides):
    """torch-bn-size1-strides, torch alone: a channels-last x whose size-1 dims have odd strides and a contiguous dy
    give dx, dweight and dbias wrong by units in f64; y is right, and dy laid out like x gives them right. The wrong
    gradients are the exact ones of a dy read in NHWC order (its contiguous storage as if channels-last)."""
    x_odd, x = _odd_channels_last(shape, strides, 0)
    dy = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    c = shape[1]
    weight, bias = torch.linspace(0.5, 1.5, c, dtype=torch.float64), torch.linspace(-1, 1, c, dtype=torch.float64)

    def grads(x, dy):
        x = x.detach().requires_grad_(True)
        w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        y = F.batch_norm(x, torch.full((c,), 0.1, dtype=torch.float64), torch.full((c,), 1.5, dtype=torch.float64),
                         w, b, training=training)
        return (y.detach(), *torch.autograd.grad(y, (x, w, b), dy))

    exact = grads(x, dy)
    wrong = grads(x_odd, dy)
    assert torch.allclose(wrong[0], exact[0], atol=1e-12)  # y is right
    assert all((a - e).abs().max() > 0.5 for a, e in zip(wrong[1:], exact[1:]))  # dx, dweight, dbias are not
    alike = grads(x_odd, torch.empty_strided(shape, strides, dtype=torch.float64).copy_(dy))
    assert all(torch.allclose(a, e, atol=1e-12) for a, e in zip(alike, exact))
    nhwc = dy.as_strided(shape, x.contiguous(memory_format=torch.channels_last).stride())  # dy's storage as NHWC
    assert all(torch.allclose(a, e, atol=1e-12) for a, e in zip(wrong[1:], grads(x, nhwc.contiguous())[1:]))


def test_code_that_calls_batch_norm_on_odd_size1_strides_has_torchs_issue():
    """The issue is the kernel's on what it is handed: a user's function that calls F.batch_norm on such a view returns
    the wrong gradients torch's own record returns on the case, and is KNOWN as that record is (the same kernel, the
    same case: one verdict); a textbook that reads dy by its strides passes the case, and the hand-written
    channels-last fast path that classifies x by raw strides (the mutant, which runs no torch kernel) fails it."""
    case = Case("batchnorm", (1, 8, 1, 3), "f64", x_format="channels_last_size1", dy_format="contiguous")
    assert compare("batchnorm", "torch", case).verdict == KNOWN
    report = compare("batchnorm", USER_BN, case)
    assert report.verdict == KNOWN and report.message.startswith("known issue torch-bn-size1-strides")
    assert compare("batchnorm", CATALOGUE["batchnorm"].CORRECT["textbook"], case).verdict == PASS
    mutant = compare("batchnorm", CATALOGUE["batchnorm"].MUTANTS["raw_stride_layout"], case)
    assert mutant.verdict == FAIL and mutant.worst.max_ratio > 1e6 and "known issue" not in mutant.message
    canonical = case.with_(x_format="channels_last")  # the same values, canonical strides: all right
    assert compare("batchnorm", USER_BN, canonical).verdict == PASS
    assert compare("batchnorm", CATALOGUE["batchnorm"].MUTANTS["raw_stride_layout"], canonical).verdict == PASS


def test_torch_native_group_norm_raises_on_a_channels_last_x_with_odd_size1_strides():
    """torch-gn-native-size1-strides-raise: aten.native_group_norm rejects a channels-last x (by is_contiguous's own
    word) whose size-1 dim has an odd stride; F.group_norm takes it and is right. Every record of torch's direct
    calls is KNOWN by the message."""
    x_odd, x = _odd_channels_last((2, 3, 1, 7), (21, 1, 1, 3), 0)
    with pytest.raises(RuntimeError, match=r"Expected X\.is_contiguous\(memory_format\) to be true"):
        torch.ops.aten.native_group_norm(x_odd, None, None, 2, 3, 7, 1, 1e-5)
    assert torch.allclose(F.group_norm(x_odd, 1), F.group_norm(x, 1), atol=1e-12)
    case = Case("groupnorm", (2, 3, 1, 7), "f64", groups=1, x_format="channels_last_size1", dy_format="contiguous")
    assert gn.NATIVE_SIZE1_STRIDES_RAISE.applies(case)
    assert not gn.NATIVE_SIZE1_STRIDES_RAISE.applies(case.with_(shape=(2, 3, 2, 7)))  # no size-1 dim: channels_last
    assert compare("groupnorm", USER_GN, case).verdict == PASS
    registered = [resolve_impl("groupnorm", i) for i in IMPLS["groupnorm"].values()
                  if gn.NATIVE_SIZE1_STRIDES_RAISE in i.known_issues]
    registered = [i for i in registered if i.unsupported(case) is None]
    assert registered
    for impl in registered:
        report = compare("groupnorm", impl, case)
        assert report.verdict == KNOWN and report.message.startswith("known issue torch-gn-native-size1-strides-raise")


def test_torch_instance_norm_with_a_batch_of_one_is_wrong_on_a_dy_with_odd_size1_strides():
    """torch-in-batch-of-one-channels-last-dy reaches a channels-last dy whose size-1 dims have odd strides (a batch of
    one always has one), whatever x's layout; a batch of two is right."""
    dy_odd, dy = _odd_channels_last((1, 8, 1, 3), (1, 1, 1, 8), 1)
    x = torch.randn(1, 8, 1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def dx(x, dy):
        x = x.detach().requires_grad_(True)
        return torch.autograd.grad(F.instance_norm(x), x, dy)[0]

    assert (dx(x, dy_odd) - dx(x, dy)).abs().max() > 0.5
    two, _ = _odd_channels_last((2, 8, 1, 3), (24, 1, 1, 8), 2)
    x2 = torch.randn(2, 8, 1, 3, dtype=torch.float64)
    assert torch.allclose(dx(x2, two), dx(x2, two.contiguous()), atol=1e-12)
