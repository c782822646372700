"""Other frameworks judged by the same reference: the JAX and TensorFlow adapters and their device worlds, the
flax and Keras records, their upstream deviations, and bad input.

The adapters are checked by textbook functions written in a style normcheck never saw (tests/_array_impls.py):
through the same adapter and world they pass, their mutants fail, and where a registered layer fails, the
textbook passes the very case (so the finding is the layer's). Each registered layer is judged on a slice of its
sweep here; the whole sweeps are docs/frameworks.md's verdict tables (scripts/framework_verdicts.py).
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from normcheck import Case, compare, get_op, resolve_impl
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.cli import main
from normcheck.core.errors import UsageError
from normcheck.engine import FAIL, KNOWN, MISTRUSTED, PASS, SKIP
from normcheck.frameworks import FRAMEWORKS
from normcheck.impls import IMPLS
from normcheck.impls import frameworks as records

NO_JAX, NO_TF = FRAMEWORKS.missing("jax"), FRAMEWORKS.missing("tf")
needs_jax = pytest.mark.skipif(NO_JAX is not None, reason=str(NO_JAX))
needs_tf = pytest.mark.skipif(NO_TF is not None, reason=str(NO_TF))
NEEDS = {"jax": needs_jax, "tf": needs_tf}

TEXTBOOK = "tests._array_impls"
TEXTBOOKS = [("jax", "batchnorm", "jax_batch_norm"), ("jax", "groupnorm", "jax_group_norm"),
             ("jax", "layernorm", "jax_layer_norm"), ("jax", "rmsnorm", "jax_rms_norm"),
             ("jax", "syncbn", "jax_sync_batch_norm"), ("tf", "batchnorm", "tf_batch_norm"),
             ("tf", "groupnorm", "tf_group_norm"), ("tf", "layernorm", "tf_layer_norm"),
             ("tf", "rmsnorm", "tf_rms_norm"),
             # fused ops: their declared operands (residual, dh) and results (h) through the adapters
             ("jax", "add_rmsnorm", "jax_add_rms_norm"), ("jax", "add_layernorm", "jax_add_layer_norm"),
             ("jax", "groupnorm_silu", "jax_group_norm_silu"), ("tf", "add_rmsnorm", "tf_add_rms_norm"),
             ("tf", "add_layernorm", "tf_add_layer_norm"), ("tf", "groupnorm_silu", "tf_group_norm_silu"),
             ("jax", "adaln", "jax_adaln"), ("tf", "adaln", "tf_adaln"),
             # stages declared by the records alone: a gate on either side of the norm, a per-channel modulation
             ("jax", "gate_rmsnorm", "jax_gate_rms_norm"), ("tf", "rmsnorm_gate", "tf_rms_norm_gate"),
             ("jax", "adagn", "jax_adagn"), ("tf", "adagn", "tf_adagn"),
             ("jax", "grouped_rmsnorm", "jax_grouped_rms_norm"), ("tf", "grouped_rmsnorm", "tf_grouped_rms_norm"),
             # a scalar gain, a statistic that is a total, eps flooring the norm
             ("jax", "scalenorm", "jax_scale_norm"), ("tf", "scalenorm", "tf_scale_norm"),
             # an activation after a modulation
             ("jax", "adagn_silu", "jax_adagn_silu"), ("tf", "adagn_silu", "tf_adagn_silu")]


def textbook(framework: str, op: str, name: str):
    return resolve_impl(op, f"{TEXTBOOK}:{name}", framework=framework)


COVERED = ("dtype", "param_dtype", "x_format", "profile", "affine", "frozen", "mode", "order", "split")


def sweep_slice(impl):
    """The first cases of the implementation's sweep (its layouts, its conventions) that together take every value
    of every field in COVERED that the sweep has: every dtype, layout, profile and path, and (SyncBN) every split."""
    seen, chosen = set(), []
    for case in default_sweep(impl.op, follows=impl.impl.follows, formats=impl.impl.formats,
                              narrowing=Narrowing(scans="without")):
        new = {(name, getattr(case, name)) for name in COVERED} - seen
        if new:
            chosen.append(case)
            seen |= new
    return chosen


@pytest.mark.parametrize("framework, op, name", [pytest.param(*t, marks=NEEDS[t[0]], id=t[2]) for t in TEXTBOOKS])
def test_a_textbook_function_passes_every_path_of_a_slice_of_the_sweep(framework, op, name):
    impl = textbook(framework, op, name)
    cases = sweep_slice(impl)
    reports = [compare(op, impl, case) for case in cases]
    wrong = [f"{r.case.label}: {r.summary()}" for r in reports if r.verdict not in (PASS, MISTRUSTED)]  # (MISTRUSTED:
    # passed, on a reference that is all but zero)
    assert not wrong, wrong[:4]
    # the slice takes the paths that matter: every layout arrays express, order 2, forward mode, eval, frozen
    # inputs, and (SyncBN) uneven and empty devices
    record = get_op(op)
    assert {c.order for c in cases} == ({1, 2, "fwd", "fwd-rev"} if record.double_backward else {1})
    assert {c.frozen for c in cases} == {"none", "x", "params"}
    assert {c.mode for c in cases} == ({"train", "eval"} if record.running_stats else {"train"})
    assert {c.x_format for c in cases} == set(impl.impl.formats)
    if op == "syncbn":
        assert any(0 in c.split for c in cases) and any(len(set(c.split)) > 1 for c in cases)


# (framework, op, mutant, its correct twin, a case, the tensor it must fail on: None for y or dx)
MUTANTS = [
    ("jax", "layernorm", "jax_layer_norm_frozen_variance", "jax_layer_norm",
     Case("layernorm", (3, 4, 2, 3), "f32", normalized_dims=2), "dx"),
    ("jax", "syncbn", "jax_sync_batch_norm_ignoring_mask", "jax_sync_batch_norm",
     Case("syncbn", (8, 3, 5, 7), "f32", split=(1, 2, 3, 2)), None),
    ("tf", "batchnorm", "tf_batch_norm_biased_running_var", "tf_batch_norm", Case("batchnorm", (8, 3), "f64"),
     "running_var"),
    # fused ops: a declared cotangent dropped, a declared operand ignored, an epilogue's derivative or place wrong
    ("jax", "add_rmsnorm", "jax_add_rms_norm_drops_dh", "jax_add_rms_norm", Case("add_rmsnorm", (3, 4, 8), "f32"),
     "dresidual"),
    ("tf", "add_rmsnorm", "tf_add_rms_norm_normalises_x", "tf_add_rms_norm", Case("add_rmsnorm", (3, 4, 8), "f32"),
     "y"),
    ("jax", "add_layernorm", "jax_add_layer_norm_normalises_x", "jax_add_layer_norm",
     Case("add_layernorm", (3, 4, 8), "bf16", normalized_dims=2), "y"),
    ("tf", "add_layernorm", "tf_add_layer_norm_drops_dh", "tf_add_layer_norm",
     Case("add_layernorm", (3, 4, 8), "bf16", normalized_dims=2), "dresidual"),
    ("jax", "groupnorm_silu", "jax_group_norm_silu_before_norm", "jax_group_norm_silu",
     Case("groupnorm_silu", (2, 6, 5), "f32", groups=3), "y"),
    ("tf", "groupnorm_silu", "tf_group_norm_silu_sigma_only", "tf_group_norm_silu",
     Case("groupnorm_silu", (2, 6, 5), "f32", groups=3), "dx"),
    # a per-sample operand's gradient summed over the batch too (an operand not shaped like x)
    ("jax", "adaln", "jax_adaln_shift_over_batch", "jax_adaln", Case("adaln", (3, 5, 8), "f32"), "dshift"),
]


@pytest.mark.parametrize("framework, op, name, twin, case, tensor", [pytest.param(*m, marks=NEEDS[m[0]], id=m[2])
                                                                      for m in MUTANTS])
def test_a_wrong_array_function_fails_where_it_is_wrong(framework, op, name, twin, case, tensor):
    report = compare(op, textbook(framework, op, name), case)
    assert report.verdict == FAIL
    failing = {t.name.split(" ")[0] for t in report.tensors if t.verdict == FAIL}
    assert tensor in failing if tensor else {"y", "dx"} & failing
    assert compare(op, textbook(framework, op, twin), case).verdict == PASS


@pytest.mark.parametrize("framework, name, message", [
    pytest.param("jax", None, None, marks=needs_jax, id="jax"),
    pytest.param("jax", "jax_add_rms_norm_stream_in_input_dtype", "h has dtype bfloat16, expected float32",
                 marks=needs_jax, id="jax-h-dtype"),
    pytest.param("tf", "tf_add_rms_norm_returns_y_only", r"returned \w+, expected \(y, h\)", marks=needs_tf,
                 id="tf-y-only"),
])
def test_a_declared_result_comes_back_in_its_own_dtype_and_place(framework, name, message):
    """A float32 residual stream under bf16 input: the textbook's h is float32 and passes; an h in x's dtype, or no
    h at all, is a one-line failure of the interface."""
    case = Case("add_rmsnorm", (3, 4, 8), "bf16", residual_dtype="f32")
    report = compare("add_rmsnorm", textbook(framework, "add_rmsnorm", name or f"{framework}_add_rms_norm"), case)
    if name is None:
        assert report.verdict == PASS and report.tensor("h").verdict == PASS
    else:
        assert report.verdict == FAIL and re.search(message, report.message), report.message


REGISTERED = [pytest.param(i.op, i.name, marks=NEEDS[i.framework], id=f"{i.op}-{i.name}")
              for i in records.FLAX + records.KERAS]


@pytest.mark.parametrize("op, name", REGISTERED)
def test_a_registered_layer_fails_only_where_its_known_issues_say(op, name):
    impl = resolve_impl(op, name)
    reports = [compare(op, impl, case) for case in sweep_slice(impl)]
    assert not [f"{r.case.label}: {r.summary()}" for r in reports if r.verdict == FAIL]
    assert {r.verdict for r in reports} & {PASS, KNOWN}


# (impl, op, the case, the issue, the tensor it shows in: None for a message): each is the layer's deviation, not
# the adapter's: a textbook function through the same adapter and world passes the same case.
WITNESSES = [
    ("flax", "layernorm", Case("layernorm", (65537, 6), "f32", profile="offset", affine="weight", normalized_dims=1),
     records.FLAX_FAST_VARIANCE, "dx", "jax_layer_norm"),
    ("flax", "batchnorm", Case("batchnorm", (8, 3), "f64"), records.FLAX_BIASED_RUNNING_VAR, "running_var",
     "jax_batch_norm"),
    ("flax", "batchnorm", Case("batchnorm", (2, 3, 2, 2), "bf16"), records.FLAX_HALF_RUNNING_STATS, None,
     "jax_batch_norm"),
    ("flax", "batchnorm", Case("batchnorm", (16, 3, 64, 64), "bf16", x_format="channels_last",
                               profile="near_constant", mode="eval"), records.FLAX_EVAL_HALF, "dbias",
     "jax_batch_norm"),
    ("flax-nnx", "batchnorm", Case("batchnorm", (8, 3), "f64", mode="eval"), records.NNX_F32_BATCH_STATS, None,
     "jax_batch_norm"),
    ("flax-nnx", "layernorm", Case("layernorm", (3, 4, 2, 3), "bf16", "f32", normalized_dims=2),
     records.NNX_HALF_PARAMS, "dbias", "jax_layer_norm"),
    ("flax", "syncbn", Case("syncbn", (8, 3, 5, 7), "f32", split=(1, 2, 3, 2)), records.FLAX_SYNC_UNWEIGHTED_MEAN,
     "y", "jax_sync_batch_norm"),
    ("keras", "batchnorm", Case("batchnorm", (8, 3), "f64"), records.KERAS_BIASED_RUNNING_VAR, "running_var",
     "tf_batch_norm"),
    ("keras", "syncbn", Case("syncbn", (4, 3, 17, 19), "f32", x_format="channels_last", profile="offset"),
     records.KERAS_SYNC_FAST_VARIANCE, "y", None),
    ("keras", "groupnorm", Case("groupnorm", (2, 6, 2, 2), "f32", groups=3, profile="near_constant", order=2),
     records.KERAS_MOMENTS_SECOND_ORDER, "d2x", "tf_group_norm"),
    # found by the covering sweeps
    ("flax", "rmsnorm", Case("rmsnorm", (65537, 1, 1, 1), "f16", profile="heavy_tailed", eps=1e-10, affine=False,
                             gamma_scale=1e-3, order=2, normalized_dims=3), records.FLAX_RMS_HALF_SECOND_ORDER, "d2x",
     "jax_rms_norm"),
    ("keras", "groupnorm", Case("groupnorm", (2, 64, 1, 7), "f16", "f32", profile="tiny", affine="bias", order=2,
                                groups=64), records.KERAS_GN_HALF_SECOND_ORDER, "d2x", "tf_group_norm"),
    ("keras", "batchnorm", Case("batchnorm", (16, 3, 64, 64), "f32", profile="near_constant", mode="eval"),
     None, None, None),  # (eval mode: no batch statistics, no finding)
    ("keras", "batchnorm", Case("batchnorm", (16, 3, 64, 64), "f32", profile="offset", affine="bias"),
     records.KERAS_FOLDED_BACKWARD, "dx", None),
    # forward mode: the same statistics and second derivatives through the forward-mode paths
    ("flax", "layernorm", Case("layernorm", (7, 4095), "f64", profile="offset", normalized_dims=1, order="fwd"),
     records.FLAX_FAST_VARIANCE, "jvp_y", "jax_layer_norm"),
    ("keras", "layernorm", Case("layernorm", (7, 17), "f64", normalized_dims=1, order="fwd-rev"),
     records.KERAS_MOMENTS_SECOND_ORDER, "jvp_dx", "tf_layer_norm"),
    # (keras-ln-folded-forward, once recorded on this case at 18 budgets, is within the rounding of the spellings a
    # kernel may write: docs/tolerance.md, Forward mode)
    ("keras", "layernorm", Case("layernorm", (65537, 1, 2), "f64", profile="offset", frozen="params",
                                normalized_dims=2, order="fwd"), None, None, None),
    ("flax-nnx", "rmsnorm", Case("rmsnorm", (65537, 1, 1, 1), "f16", profile="heavy_tailed", eps=1e-10, affine=False,
                                 gamma_scale=1e-3, order="fwd-rev", normalized_dims=3),
     records.FLAX_RMS_HALF_SECOND_ORDER, "jvp_dx", "jax_rms_norm"),
]


def recorded_version(framework: str) -> str | None:
    """Why the installed layers are not the versions their deviations were recorded with (None: they are)."""
    installed = {**FRAMEWORKS.versions("jax"), **FRAMEWORKS.versions("tf")}
    for package in {"jax": ("flax",), "tf": ("keras", "tensorflow")}[framework]:
        if not installed[package].startswith(records.RECORDED_WITH[package]):
            return f"deviations recorded with {package} {records.RECORDED_WITH[package]}, this is {installed[package]}"
    return None


@pytest.mark.parametrize("name, op, case, issue, tensor, clean", [
    pytest.param(*w, marks=NEEDS[IMPLS[w[1]][w[0]].framework], id=w[3].key if w[3] else f"{w[0]}-{w[1]}-no-issue")
    for w in WITNESSES])
def test_an_upstream_deviation_reproduces_and_is_the_layers(name, op, case, issue, tensor, clean):
    other = recorded_version(IMPLS[op][name].framework)
    if other:  # (if a new release fixes one, this test says so there: drop the record then)
        pytest.skip(other)
    report = compare(op, name, case)
    if issue is None:
        assert report.verdict == PASS
        return
    assert issue.applies(case)
    assert report.verdict == KNOWN and issue.key in report.message.split(":")[0]
    if tensor is not None:
        failing = {t.name: t for t in report.tensors if t.verdict == FAIL}
        assert tensor in failing and failing[tensor].max_ratio > 2
    else:
        assert issue.signature.explains_message(report.message.split(": ", 1)[1])
    if clean is not None:  # (MISTRUSTED: passed, where some tensor's budget is as large as the tensor)
        assert compare(op, textbook(IMPLS[op][name].framework, op, clean), case).verdict in (PASS, MISTRUSTED)


@needs_tf
def test_tensorflow_sums_over_leading_axes_in_sequence():
    """tf-cpu-outer-axis-sums: TensorFlow's own reduction, measured directly against jax's and torch's."""
    import numpy as np
    import tensorflow as tf
    import torch

    x = Case("batchnorm", (16, 3, 64, 64), "f32", profile="offset").make_inputs().x
    exact = x.mean(axis=(0, 2, 3))
    u = 2.0 ** -24

    def ulps(got):
        return float(np.max(np.abs(np.asarray(got, np.float64) - exact) / (u * np.abs(exact))))

    x32 = x.astype(np.float32)
    assert ulps(tf.reduce_mean(tf.constant(x32), axis=(0, 2, 3))) > 1000
    assert ulps(torch.from_numpy(x32).mean(dim=(0, 2, 3))) < 4
    # the innermost axes are summed accurately: the same values, laid out channel-major
    assert ulps(tf.reduce_mean(tf.constant(np.ascontiguousarray(x32.transpose(1, 0, 2, 3)).reshape(3, -1)), axis=1)) < 4
    assert records.TF_OUTER_AXIS_SUMS.code == ("tensorflow",)  # any TensorFlow implementation: the kernel is TF's


# ----------------------------------------------------------------------------- the worlds of simulated devices
SPLIT = Case("syncbn", (8, 3, 5), "f64", split=(3, 2, 3))


@needs_tf
def test_a_raising_replica_is_named():
    report = compare("syncbn", textbook("tf", "syncbn", "tf_sync_raises_on_replica1"), SPLIT)
    assert report.verdict == FAIL
    assert report.message.startswith("rank 1: raised ValueError: replica 1 refuses on purpose"), report.message


@pytest.mark.parametrize("name", [pytest.param("flax", marks=needs_jax), pytest.param("keras", marks=needs_tf)])
def test_a_world_larger_than_the_simulated_devices_is_one_line(name, capsys):
    assert main(["compare", "--one-case", "--op", "syncbn", "--impl", name, "--split", ",".join(["1"] * 9)]) == 2
    world = IMPLS["syncbn"][name].world
    assert capsys.readouterr().err.strip() == f"normcheck: error: world size 9 is outside 1-8 for the {world} backend"


# ----------------------------------------------------------------------------- the command line and bad input
@needs_jax
def test_flax_syncbn_runs_its_sweep_over_uneven_and_empty_devices(capsys):
    # (the covering design's cases: its splits; each boundary scan's new shape is one more XLA compilation)
    code = main(["compare", "--op", "syncbn", "--impl", "flax", "--scans", "without"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "split=" in line]
    assert code == 0 and f": {len(rows)} cases: " in out.splitlines()[-1] and len(rows) > 40  # (every case ran)
    assert any("split=2,0,6" in r and r.startswith("KNOWN") for r in rows)


@needs_tf
def test_keras_syncbn_runs_its_sweep_over_uneven_and_empty_replicas(capsys):
    code = main(["compare", "--op", "syncbn", "--impl", "keras", "--scans", "without"])  # (as flax's)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "split=" in line]
    assert code == 0 and f": {len(rows)} cases: " in out.splitlines()[-1] and len(rows) > 40
    assert any("split=0,3,5" in r and r.startswith("PASS") for r in rows)  # uneven, an empty replica: right


def test_an_unknown_framework_is_one_line(capsys):
    assert main(["compare", "--op", "layernorm", "--impl", f"{TEXTBOOK}:jax_layer_norm", "--framework", "mxnet"]) == 2
    assert capsys.readouterr().err.strip() == ("normcheck: error: unknown framework 'mxnet'; choose one of torch, "
                                               "numpy, jax, tf")


@needs_jax
def test_a_jax_function_with_the_wrong_signature_is_one_line(capsys):
    code = main(["compare", "--op", "layernorm", "--impl", f"{TEXTBOOK}:jax_layer_norm_wrong_signature",
                 "--framework", "jax"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "takes 4 positional arguments; the contract is fn(x, weight, bias, *, axes, eps)" in err


@needs_jax
def test_a_layer_in_a_world_of_another_framework_is_one_line(capsys):
    assert main(["compare", "--op", "syncbn", "--impl", "flax", "--backend", "gloo"]) == 2
    assert capsys.readouterr().err.strip() == ("normcheck: error: the gloo world runs torch implementations; flax is "
                                               "a JAX one (its worlds: jax-devices)")


def test_an_op_without_an_array_contract_refuses_array_functions():
    with pytest.raises(UsageError, match="instancenorm has no array contract yet"):
        resolve_impl("instancenorm", f"{TEXTBOOK}:jax_layer_norm", framework="jax")


def test_without_the_extra_a_layer_is_a_one_line_error_naming_it(monkeypatch):
    from normcheck import frameworks

    entry = frameworks._ADAPTERS["jax"]
    monkeypatch.setitem(frameworks._ADAPTERS, "jax", entry[:2] + (("normcheck_absent_package",),) + entry[3:])
    with pytest.raises(UsageError, match=r"the JAX implementations need normcheck_absent_package: "
                                         r"pip install -e \"\.\[jax\]\""):
        resolve_impl("layernorm", "flax")


def test_an_expressible_layout_only_and_a_skip_saying_so_otherwise():
    impl = IMPLS["layernorm"]["flax"]
    assert impl.formats == ("contiguous",)
    why = impl.unsupported(Case("layernorm", (3, 4, 2, 3), "f32", x_format="channels_last", normalized_dims=2))
    assert "its arrays have no strides" in why
    sweep = default_sweep("batchnorm", formats=IMPLS["batchnorm"]["flax"].formats)
    assert {c.x_format for c in sweep} == {"contiguous", "channels_last", "channels_last_3d"}
    assert all(c.dy_format == c.x_format for c in sweep)


def test_importing_normcheck_and_listing_imports_no_other_framework():
    code = ("import sys, normcheck; from normcheck.cli import main; main(['list']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'tensorflow', 'keras'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    listing, imported = out.stdout.rsplit("\n", 2)[0], out.stdout.rsplit("\n", 2)[1]
    assert imported == "[]"
    for record in records.IMPLS:  # every one listed, with its one-line description
        assert f"{record.name:<24} {record.description}" in listing


@needs_jax
def test_a_failing_jax_function_replays_under_its_framework(capsys):
    spec = f"{TEXTBOOK}:jax_layer_norm_frozen_variance"
    assert main(["compare", "--one-case", "--op", "layernorm", "--impl", spec, "--framework", "jax", "--shape", "3,4,2,3",
                 "--normalized-dims", "2"]) == 1
    replay = next(line.split("replay: ", 1)[1] for line in capsys.readouterr().out.splitlines() if "replay: " in line)
    assert replay.endswith("--framework jax")
    assert main(replay.split()[1:]) == 1  # (without --framework the function would be called as torch code)


# ----------------------------------------------------------------------------- last: a hang restarts the worker
# (so the tests above share one worker: a fresh one imports JAX and TensorFlow again, seconds each)
@needs_jax
def test_a_raising_or_hanging_device_program_fails_its_case():
    report = compare("syncbn", textbook("jax", "syncbn", "jax_sync_raises"), SPLIT)
    assert report.verdict == FAIL and report.message.startswith("raised ValueError: the device program refuses")
    hangs = resolve_impl("syncbn", f"{TEXTBOOK}:jax_sync_hangs", framework="jax", timeout=2)
    report = compare("syncbn", hangs, SPLIT)
    assert report.verdict == FAIL and report.message.startswith("timed out after 2 s at _array_impls.py")
    assert compare("syncbn", "flax", SPLIT).verdict != FAIL  # and the next case runs in a fresh worker
