"""The compare engine: every misbehaviour of an implementation becomes a failing row that says what
happened; correct ones pass; known upstream issues are attributed, not hidden."""
import pytest
import torch
import torch.nn.functional as F

from normcheck import Case, compare, resolve_impl
from normcheck.engine import FAIL, KNOWN, MISTRUSTED, PASS, SKIP

BN = Case("batchnorm", (4, 3, 5), "f32")
GN = Case("groupnorm", (2, 4, 6), "f32", groups=2)


def test_torch_passes_and_reports_every_output():
    report = compare("batchnorm", "torch", BN)
    assert report.verdict == PASS
    assert {t.name for t in report.tensors} == {"y", "dx", "dweight", "dbias", "running_mean", "running_var"}
    assert all(0 <= t.max_ratio <= 1 for t in report.tensors)


def test_native_backward_also_reports_saved_statistics():
    names = {t.name for t in compare("groupnorm", "torch-native-backward", GN).tensors}
    assert {"mean", "rstd", "dx"} <= names


def test_raising_implementation_is_a_failing_row():
    def broken(*args):
        raise RuntimeError("kernel exploded\nsecond line")

    report = compare("batchnorm", broken, BN)
    # one line: the first line of the message, and where in the implementation it was raised
    assert report.verdict == FAIL and report.message == "raised RuntimeError: kernel exploded (at test_compare.py:28 in broken)"
    assert "second line" in report.traceback and "\n" not in report.message


def test_wrong_shape_and_dtype_are_named():
    report = compare("groupnorm", lambda x, g, w, b, eps: F.group_norm(x, g, w, b, eps)[:1], GN)
    assert report.verdict == FAIL and "y has shape (1, 4, 6), expected (2, 4, 6)" in report.message
    report = compare("groupnorm", lambda x, g, w, b, eps: F.group_norm(x, g, w, b, eps).double(), GN)
    assert report.verdict == FAIL and "y has dtype f64, expected f32" in report.message


def test_nan_outputs_are_counted_as_mismatches():
    report = compare("groupnorm", lambda x, g, w, b, eps: F.group_norm(x, g, w, b, eps) * float("nan"), GN)
    assert report.verdict == FAIL
    assert report.tensor("y").nonfinite_mismatches == x_numel(GN)


def x_numel(case):
    return case.numel


def test_input_modification_is_detected():
    def sneaky(x, g, w, b, eps):
        y = F.group_norm(x, g, w, b, eps)
        w.data.mul_(2)
        return y

    report = compare("groupnorm", sneaky, GN)
    assert report.verdict == FAIL and report.message.startswith("writes its input weight in place (mul_ at "
                                                                "test_compare.py:"), report.message


def _writes_x(x, g, w, b, eps):
    x.mul_(1.0)  # no value changes, and x requires grad: torch would raise "a leaf Variable ... in-place"
    return F.group_norm(x, g, w, b, eps)


def _writes_weight_after_the_forward(x, g, w, b, eps):
    y = F.group_norm(x, g, w, b, eps)
    with torch.no_grad():
        w += 1  # torch's backward would raise "modified by an inplace operation ... is at version 1"
    return y


def _writes_through_out(x, g, w, b, eps):
    y = F.group_norm(x, g, w, b, eps)
    torch.mul(b, 1.0, out=b.data)
    return y


@pytest.mark.parametrize("fn, name, how", [(_writes_x, "x", "mul_"), (_writes_weight_after_the_forward, "weight",
                                            "add_"), (_writes_through_out, "bias", "mul(out=...)")])
def test_a_write_into_an_input_is_named_by_normcheck_where_it_happens(fn, name, how):
    report = compare("groupnorm", fn, GN)
    assert report.verdict == FAIL and report.message.startswith(f"writes its input {name} in place ({how} at "
                                                                f"test_compare.py:"), report.message
    assert "leaf Variable" not in report.message and "version" not in report.message


def test_writes_into_the_implementations_own_tensors_are_not_flagged():
    def own_buffers(x, g, w, b, eps):
        y = F.group_norm(x.clone(), g, w.clone().requires_grad_(), b, eps)
        z = torch.empty_like(y)
        torch.mul(y, 1.0, out=z)
        z.add_(0.0)
        return z

    # (w.clone() cuts γ's gradient: the row fails on dweight, not on a write)
    report = compare("groupnorm", own_buffers, GN)
    assert "in place" not in report.message, report.message


def test_detached_output_and_missing_gradient():
    report = compare("groupnorm", lambda x, g, w, b, eps: F.group_norm(x, g, w, b, eps).detach(), GN)
    assert report.verdict == FAIL and "detached" in report.message
    report = compare("groupnorm", lambda x, g, w, b, eps: F.group_norm(x, g, w.detach(), b, eps), GN)
    assert report.verdict == FAIL and report.message == "dweight is None: no gradient reaches that input"


def test_running_stats_not_updated_is_a_failure():
    report = compare("batchnorm", lambda x, rm, rv, w, b, t, m, e: F.batch_norm(x, None, None, w, b, t, m, e), BN)
    assert report.verdict == FAIL and report.worst.name in ("running_mean", "running_var")


def test_wrong_gradient_names_tensor_index_and_values():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            return F.group_norm(x, 2, w, b, 1e-5)

        @staticmethod
        def backward(ctx, dy):
            return dy, dy.sum((0, 2)), dy.sum((0, 2))  # dx = dy: plausible-looking, wrong

    report = compare("groupnorm", lambda x, g, w, b, eps: Wrong.apply(x, w, b), GN)
    assert report.verdict == FAIL
    dx = report.tensor("dx")
    assert dx.verdict == FAIL and dx.max_ratio > 1e3 and len(dx.worst_index) == 3
    assert "dx: ratio" in report.summary() and "expected" in report.summary()


def test_unsupported_case_is_a_skip_with_reason():
    report = compare("groupnorm", "torch-native-backward", GN.with_(x_format="strided"))
    assert report.verdict == SKIP and "requires x contiguous" in report.message


def test_known_upstream_issue_is_reported_with_its_numbers():
    case = Case("groupnorm", (2, 8, 32, 64), "f32", x_format="channels_last", profile="offset", groups=2)
    report = compare("groupnorm", "torch", case)
    assert report.verdict == KNOWN
    assert report.message.startswith("known issue torch-gn-channels-last-variance: dx: ratio")
    assert report.worst.max_ratio > 10
    # torch's kernel given as user code: the issue follows the kernel it runs
    assert compare("groupnorm", resolve_impl("groupnorm", F.group_norm), case).verdict == KNOWN


def test_all_zero_reference_is_mistrusted_not_passed():
    case = Case("batchnorm", (6, 1, 4), "f64", profile="sparse_dy")  # one channel, dy all zero
    report = compare("batchnorm", "torch", case)
    assert report.verdict == MISTRUSTED and report.tensor("dx").verdict == MISTRUSTED


def test_an_implementation_can_report_the_path_it_took():
    from normcheck import Impl

    impl = Impl("with-path", "groupnorm", "reports a path", F.group_norm, path=lambda case: "pixels/2d")
    report = compare("groupnorm", impl, GN)
    assert report.verdict == PASS and report.path == "pixels/2d"
    assert report.summary().startswith("[pixels/2d] ") and report.to_dict()["path"] == "pixels/2d"


def test_the_engine_judges_only_bound_implementations():
    from normcheck import Impl, UsageError
    from normcheck.engine import judge

    record = Impl("unbound", "groupnorm", "not bound to a world yet", F.group_norm)
    with pytest.raises(UsageError, match="not bound to a world"):
        judge(GN, record)
    assert judge(GN, resolve_impl("groupnorm", record)).verdict == PASS


def test_a_pass_on_a_loose_budget_says_it_proves_little():
    # f32, |mean| >> std, x channels-last and dy contiguous: a correct f32 kernel's own error in dx and dγ
    # is larger than a dropped backward term, so the mutant is within budget here: the row is MISTRUSTED, not PASS
    # (zero trust), and says why
    from tests.mutants.batchnorm import drop_xhat_term

    case = Case("batchnorm", (8, 3, 32, 32), "f32", x_format="channels_last", dy_format="contiguous", profile="offset")
    report = compare("batchnorm", drop_xhat_term, case)
    assert report.verdict == MISTRUSTED and report.tensor("dx").slack > 100 and report.tensor("y").slack < 1
    assert report.tensor("dx").verdict == MISTRUSTED and report.tensor("y").verdict == PASS
    assert "a pass proves little for dweight" in report.summary() and "dx (×" in report.summary()
    tight = compare("batchnorm", "torch", BN)
    assert all(t.slack < 1 for t in tight.tensors) and "proves little" not in tight.summary()


def test_a_sweep_judged_with_the_next_case_prepared_ahead_judges_each_case_as_alone():
    """engine.compare.ahead yields every case in order, the next one's inputs and expectations computed in a thread
    while the current one runs: the reports are those of each case judged alone, and the prepared ones are cached."""
    from normcheck.engine.compare import ahead, case_inputs, forget_cases, yardsticks
    from normcheck.engine.tolerance import CONSTANTS
    impl = resolve_impl("layernorm", "torch", hints=False)
    cases = [Case("layernorm", (r, 24), dtype, seed=r) for r in (2, 3, 5) for dtype in ("f32", "bf16")]
    forget_cases()
    alone = [compare("layernorm", impl, c) for c in cases]
    forget_cases()
    judged = []
    for case in ahead(cases):
        judged.append(compare("layernorm", impl, case))
    assert [c for c in ahead(cases)] == cases
    assert [(r.verdict, [(t.name, t.max_ratio) for t in r.tensors]) for r in judged] == \
        [(r.verdict, [(t.name, t.max_ratio) for t in r.tensors]) for r in alone]
    declined = list(ahead(cases, wanted=lambda c: False))  # (a case the implementation declines: nothing prepared)
    assert declined == cases
    cached = case_inputs(cases[-1]), yardsticks(cases[-1], CONSTANTS)
    assert cached[0] is case_inputs(cases[-1]) and set(cached[1]) >= {"y", "dx"}


def scribbling_baseline(case, inputs):
    """normcheck's baseline, which then writes over the arrays it was handed (a NumPy kernel working in place)."""
    from normcheck.engine.baseline import baseline_outputs
    outputs = baseline_outputs(case, inputs)
    for a in (inputs.x, inputs.dy, *inputs.extra.values()):
        a[...] = 7.0
    return outputs


@pytest.mark.parametrize("backend", ["isolated", "in-process"])
def test_an_implementation_that_writes_into_its_inputs_changes_neither_its_second_run_nor_the_next_judging(backend):
    from normcheck import Impl
    from normcheck.engine.compare import case_inputs
    # (twice: the determinism run reads the same inputs as the first, whichever process keeps them between runs)
    impl = resolve_impl("add_layernorm", Impl("scribbler", "add_layernorm", "test code", scribbling_baseline,
                                              convention="direct", framework="numpy"), backend=backend, hints=False)
    case = Case("add_layernorm", (4, 16), "f32", normalized_dims=1)
    master = case_inputs(case).x.copy()
    report = compare("add_layernorm", impl, case)
    assert report.verdict == PASS, report.summary()
    assert (case_inputs(case).x == master).all() and compare("add_layernorm", "torch", case).verdict == PASS
