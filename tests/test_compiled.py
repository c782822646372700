"""torch.compile records: the compiled code is what is judged (not eager code under the compiled name), compiled
once per guard set and reused; and what Inductor's code gets wrong is recorded and reproduced. The whole sweeps:
docs/frameworks.md (scripts/framework_verdicts.py --framework compile)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config

from normcheck import Case, compare, resolve_impl
from normcheck.engine import FAIL, KNOWN, PASS
from normcheck.impls.frameworks import INDUCTOR_HALF_BACKWARD
from normcheck.numerics.dtypes import quantise
from tests.mutants import CATALOGUE

LN = "layernorm"


def test_a_compiled_record_judges_compiled_code_and_reuses_it_across_shapes():
    impl = resolve_impl(LN, "torch-compile", backend="in-process")  # (here: the compile counters are this process's)
    before = counters["stats"]["unique_graphs"]
    first = compare(LN, impl, Case(LN, (3, 5, 7), "f32", normalized_dims=1))
    compiled = counters["stats"]["unique_graphs"]
    second = compare(LN, impl, Case(LN, (4, 6, 9), "f32", normalized_dims=1, seed=1))  # other sizes, same guards
    assert first.verdict == second.verdict == PASS
    assert compiled > before  # it compiled (a dispatch mode would have made torch.compile run eagerly)
    assert counters["stats"]["unique_graphs"] == compiled  # and reused: dynamic shapes, nothing recompiled
    from normcheck.impls.compiled import layer_norm

    x = torch.randn(2, 3, 4, requires_grad=True)
    assert type(layer_norm(x, (4,), None, None, 1e-5).grad_fn).__name__ == "CompiledFunctionBackward"


def test_a_compiled_record_is_once_differentiable_by_declaration_and_a_compiled_function_says_so_itself():
    """Either way its order-2 case is judged as far as it goes: y and the gradients, the row naming what it could not
    judge and why."""
    case = Case(LN, (3, 5, 7), "f32", normalized_dims=1, order=2)
    report = compare(LN, "torch-compile", case)
    assert report.verdict == PASS and "only once differentiable" in report.unjudged and report.judged_case.order == 1
    from normcheck.impls.compiled import layer_norm

    # the same compiled function given as user code (order 2 allowed; recognised as compiled, so no dispatch mode
    # makes it run eagerly): torch's own refusal says what was not judged
    report = compare(LN, resolve_impl(LN, layer_norm, backend="in-process"), case)
    assert report.verdict == PASS and "aot_autograd does not currently support double backward" in report.unjudged
    assert {t.name for t in report.tensors} == {"y", "dx", "dweight", "dbias"}


def test_inductors_half_precision_backward_reproduces_where_eager_code_passes():
    """inductor-half-backward: 3 rows of 8193, bf16 input with f32 parameters: dγ sums 3 products per element,
    and the compiled backward's come back with bf16's precision; a textbook LayerNorm of eager torch ops
    (tests/mutants/layernorm.py) passes the same case."""
    case = Case(LN, (1, 3, 8193), "bf16", "f32", profile="sparse_dy", normalized_dims=1)
    impl = resolve_impl(LN, "torch-compile", backend="in-process")  # (reuses the compiles above, adds this guard set)
    report = compare(LN, impl, case)
    assert report.verdict == KNOWN and INDUCTOR_HALF_BACKWARD.key in report.message
    failing = {t.name: t.max_ratio for t in report.tensors if t.verdict == FAIL}
    assert failing.get("dweight", 0) > 10
    assert compare(LN, CATALOGUE[LN].CORRECT["textbook"], case).verdict == PASS


# A fused op's compiled composite, judged with its declared interface (add + norm's residual, dh and h; adaLN's scale
# and shift): a case each,
# and a half-precision GroupNorm + SiLU (each a compile of its own: a few seconds)
FUSED = [Case("add_rmsnorm", (3, 5, 16), "f32"), Case("add_layernorm", (3, 5, 16), "bf16", normalized_dims=1),
         Case("groupnorm_silu", (2, 6, 5), "f32", groups=3),
         Case("groupnorm_silu", (2, 6, 4, 4), "f16", "f32", groups=3), Case("adaln", (2, 3, 16), "f32")]


@pytest.mark.parametrize("case", FUSED, ids=lambda c: f"{c.op}-{c.dtype}")
def test_a_fused_ops_compiled_composite_is_compiled_and_judged_on_its_whole_interface(case):
    impl = resolve_impl(case.op, "torch-compile", backend="in-process")
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    report = compare(case.op, impl, case)
    assert report.verdict == PASS, report.summary()
    # compiled whole: no graph break leaves a part of it eager
    assert counters["stats"]["unique_graphs"] > graphs and sum(counters["graph_break"].values()) == breaks
    record = case.record
    assert {"y", *case.grads, *(r.name for r in record.results_of(case))} <= {t.name for t in report.tensors}


def test_inductors_half_precision_backward_follows_layer_norm_into_add_layernorm():
    """inductor-half-backward in the compiled add + LayerNorm composite (F.layer_norm of a bf16 h with f32 γ): the
    case LayerNorm's reproduction uses, dγ off by 65 budgets, where the textbook composite passes."""
    op = "add_layernorm"
    case = Case(op, (1, 3, 8193), "bf16", "f32", profile="sparse_dy", normalized_dims=1)
    report = compare(op, resolve_impl(op, "torch-compile", backend="in-process"), case)
    assert report.verdict == KNOWN and INDUCTOR_HALF_BACKWARD.key in report.message
    assert {t.name for t in report.tensors if t.verdict == FAIL} == {"dweight"}
    assert compare(op, CATALOGUE[op].CORRECT["composed"], case).verdict == PASS


def test_inductors_half_precision_backward_follows_layer_norm_into_adaln_where_x_is_frozen():
    """inductor-half-backward in the compiled adaLN composite: with x frozen the compiled backward recomputes x̂ from
    the mean and rstd the decomposition saved in bf16, so dγ is Σ dŷ·(x − q(μ))·q(rstd) (dγ 78 budgets off); the
    textbook composite passes the case, and so does the compiled code where x is differentiated (the record's region)."""
    op = "adaln"
    case = Case(op, (2, 3, 1025), "bf16", "f32", normalized_dims=1, frozen="x")
    impl = resolve_impl(op, "torch-compile", backend="in-process")
    report = compare(op, impl, case)
    assert report.verdict == KNOWN and INDUCTOR_HALF_BACKWARD.key in report.message
    assert {t.name for t in report.tensors if t.verdict == FAIL} == {"dweight"}
    assert compare(op, CATALOGUE[op].CORRECT["composed"], case).verdict == PASS
    assert compare(op, impl, case.with_(frozen="none")).verdict == PASS

    # the cause: dγ from the statistics rounded to bf16, to float32's precision (the reference's is 1e-2 away)
    from normcheck.impls.compiled import modulate

    i = case.make_inputs()
    x, dy, scale, shift = (torch.tensor(a).to(torch.bfloat16) for a in (i.x, i.dy, i.extra["scale"], i.extra["shift"]))
    weight = torch.tensor(i.weight, dtype=torch.float32, requires_grad=True)
    modulate(x, scale, shift, (1025,), weight, torch.tensor(i.bias, dtype=torch.float32), case.eps).backward(dy)
    rows = i.x.reshape(-1, 1025)
    mean = rows.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt(((rows - mean) ** 2).mean(axis=1, keepdims=True) + case.eps)
    dy_norm = (i.dy * (1 + i.extra["scale"][:, None, :])).reshape(-1, 1025)
    rounded = (dy_norm * (rows - quantise(mean, "bf16")) * quantise(rstd, "bf16")).sum(axis=0)
    exact = (dy_norm * (rows - mean) * rstd).sum(axis=0)
    assert np.abs(weight.grad.double().numpy() - rounded).max() < 1e-4 < np.abs(rounded - exact).max()


def test_inductor_taking_rstd_from_the_unrounded_residual_sum_passes():
    """f16 add + RMSNorm on tiny values with eps=None, where rounding h to f16 moves rstd: where Inductor fuses the add
    into the norm's reduction its rstd is the unrounded sum's, eager torch's h's. A fused kernel may read either
    (docs/tolerance.md, Fused prologues); the compiled dγ was 1.4 budgets off while the bound followed h alone, and
    was recorded as a deviation (inductor-unrounded-half-sum) until the bound took the unrounded sum in."""
    op = "add_rmsnorm"
    case = Case(op, (2, 13, 15, 21), "f16", "f32", profile="tiny", normalized_dims=3, eps=None)
    impl = resolve_impl(op, "torch-compile", backend="in-process")
    torch._dynamo.reset()  # (a first compile of the composite, which fuses the add into the norm's reduction)
    try:
        report = compare(op, impl, case)
        assert report.verdict == PASS, report.summary()
        assert compare(op, "torch", case).verdict == PASS
        with inductor_config.patch(emulate_precision_casts=True):  # (h rounded, as eager code does)
            torch._dynamo.reset()
            assert compare(op, impl, case).verdict == PASS
    finally:
        torch._dynamo.reset()
