"""Real layers' conventions, declared: the dtype y comes back in (--output-dtype), the finest precision a kernel
computes in (--compute-dtype), a casting chain; and the fields a run fixes on every sweep case (--eps, ...).
A layer passes its sweep under the conventions it follows and fails it under others."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from normcheck import Case, compare, resolve_impl
from normcheck.cli import main
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL, MISTRUSTED, PASS, judge

LAYERS = "tests._real_layers"
LLAMA = dict(casting="before-weight", output_dtype="promote", compute_dtype="f32")


def verdicts(op: str, spec: str, follows: dict, keep=lambda case: True, first_failure: bool = False) -> dict:
    """The failures of `spec` over the op's covering design in the conventions `follows` (up to the first, if
    asked): conventions are what the design's dtypes, layouts and paths meet; the boundary scans try sizes."""
    impl = resolve_impl(op, spec)
    failed, ran = [], 0
    for case in default_sweep(op, follows=tuple(follows.items()), narrowing=Narrowing(scans="without")):
        if keep(case):
            report, ran = judge(case, impl), ran + 1
            failed += [report.summary()] * (report.verdict == FAIL)
            if failed and first_failure:
                break
    return {"failed": failed, "ran": ran}


def test_a_llama_style_rms_norm_passes_its_sweep_as_declared_and_fails_it_declared_otherwise():
    spec = f"{LAYERS}:llama_rms_norm"
    assert verdicts("rmsnorm", spec, LLAMA)["failed"] == []
    for wrong in ({"casting": "end"}, {"output_dtype": "input"}, {"compute_dtype": "f64"}):
        assert verdicts("rmsnorm", spec, {**LLAMA, **wrong}, first_failure=True)["failed"], wrong


def test_a_llama_style_rms_norm_passes_forward_over_reverse_with_x_frozen_in_mixed_precision():
    # (jvp_y = γ̇·x̂ with x̂ rounded to f16 before the weight, promoted to f32: where x̂ is subnormal in f16 its rounding
    # is absolute, half the subnormals' spacing, which the directional bound's rounding steps now carry; 2.02 budgets
    # before, on this correct layer)
    case = Case("rmsnorm", (1, 65537, 17), "f16", "f32", "sliced", "expanded", "big", eps=0.01, frozen="x",
                order="fwd-rev", normalized_dims=1, **LLAMA)
    report = judge(case, resolve_impl("rmsnorm", f"{LAYERS}:llama_rms_norm"))
    assert report.verdict != FAIL, report.summary()
    assert report.tensor("jvp_y").max_ratio > 0  # (judged by its values, not waved through)


def test_a_llama_style_rms_norm_passes_where_the_gradient_its_cast_rounds_is_subnormal():
    # (x = 0 and eps = None: r = 1/√eps ≈ 2896, x̂ = 0 and dx = r·round16(γ·dy); γ·dy down to 2e-6 is subnormal in f16,
    # where the cast's rounding is absolute, up to u·tiny: found by --budget's search, dx 1.01 budgets before)
    case = Case("rmsnorm", (1, 400), "f16", profile="near_constant", eps=None, gamma_scale=0.001, normalized_dims=1,
                **LLAMA)
    report = judge(case, resolve_impl("rmsnorm", f"{LAYERS}:llama_rms_norm"))
    assert report.verdict != FAIL and report.tensor("dx").max_ratio > 0, report.summary()


@pytest.mark.parametrize("order", ["fwd-rev", 2])
def test_the_directional_reference_meets_the_x_hat_a_casting_chain_rounds(order):
    # (y = γ·round(x̂): along γ̇ alone, y's JVP (and at order 2, d2dy = ∂⟨ddγ, dγ⟩/∂dy) is γ̇·round(x̂), in float64 here)
    import torch

    from normcheck.engine.expected import expected_outputs

    case = Case("rmsnorm", (4, 64), "f16", "f32", eps=1e-3, frozen="x", order=order, normalized_dims=1, **LLAMA)
    inputs = case.make_inputs()
    x = torch.tensor(inputs.x)
    rounded = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + case.eps)).to(torch.float16).double()
    name = "jvp_y" if order == "fwd-rev" else "d2dy"
    got = expected_outputs(case, inputs)[name]
    np.testing.assert_allclose(got, (torch.tensor(inputs.ddweight) * rounded).numpy(), rtol=1e-12, atol=0)


def test_an_f32_compute_layers_f64_rows_pass_only_under_compute_f32():
    f64 = verdicts("layernorm", f"{LAYERS}:fp32_layer_norm", {"compute_dtype": "f32"}, lambda c: c.dtype == "f64")
    assert f64["ran"] >= 10 and f64["failed"] == []
    undeclared = verdicts("layernorm", f"{LAYERS}:fp32_layer_norm", {}, lambda c: c.dtype == "f64")
    assert len(undeclared["failed"]) > undeclared["ran"] // 2, undeclared  # ratios of 1e7 and more: f32 vs f64 budget


MIXED = Case("layernorm", (8, 64), dtype="bf16", param_dtype="f32", normalized_dims=1, compute_dtype="f32")


def test_a_promoted_output_is_judged_on_its_values():
    report = compare("layernorm", f"{LAYERS}:promoting_layer_norm", MIXED.with_(output_dtype="promote"))
    assert report.verdict in (PASS, MISTRUSTED) and report.tensor("y").max_ratio > 0, report.summary()
    wrong = compare("rmsnorm", f"{LAYERS}:llama_rms_norm_off_by_a_little",
                    Case("rmsnorm", (8, 64), dtype="bf16", param_dtype="f32", normalized_dims=1, **LLAMA))
    assert wrong.verdict == FAIL and wrong.message.startswith("y: ratio"), wrong.message


@pytest.mark.parametrize("layer, declared, got, expected, remedy", [
    ("promoting_layer_norm", "input", "f32", "bf16", "f32 is result_type over x and the parameters and buffers the case uses: declare --output-dtype promote"),
    ("fp32_layer_norm", "promote", "bf16", "f32", "bf16 is x's dtype: declare --output-dtype input"),
])
def test_an_output_in_the_other_conventions_dtype_is_one_fail_naming_both_and_the_remedy(layer, declared, got,
                                                                                           expected, remedy):
    report = compare("layernorm", f"{LAYERS}:{layer}", MIXED.with_(output_dtype=declared))
    assert report.verdict == FAIL and report.message == f"y has dtype {got}, expected {expected} ({remedy})"


def _refused(capsys, *args) -> str:
    """What `normcheck compare ARGS` says on stderr when it refuses them (exit 2), run in this process."""
    assert main(["compare", *args]) == 2
    return capsys.readouterr().err


def test_eps_momentum_and_affine_fix_every_case_of_the_sweep(capsys):
    # (the covering design's cases: tests/meta/test_scans.py checks that the options narrow the scans alike)
    out = io.StringIO()
    code = main(["compare", "--op", "groupnorm", "--eps", "0.01", "--momentum", "0.5", "--affine", "weight", "--json",
                 "--scans", "without"], out)
    assert code == 0, capsys.readouterr().err
    cases = [c["case"] for c in json.loads(out.getvalue())["cases"]]
    expected = default_sweep("groupnorm", narrowing=Narrowing.of({"eps": 0.01, "momentum": 0.5, "affine": "weight"},
                                                                 scans="without"))
    design = default_sweep("groupnorm", narrowing=Narrowing(scans="without"))
    assert len(cases) == len(expected) > len(design) // 2  # a sweep, not one case
    assert {(c["eps"], c["momentum"], c["affine"]) for c in cases} == {(0.01, 0.5, "weight")}
    assert len({c["dtype"] for c in cases}) > 2 and len({c["x_format"] for c in cases}) > 2


def test_a_value_no_case_of_the_sweep_can_take_is_one_line(capsys):
    # (--eps 0 alone narrows BatchNorm's sweep to eval mode, where it is legal)
    assert {c.mode for c in default_sweep("batchnorm", narrowing=Narrowing.of({"eps": 0.0}))} == {"eval"}
    assert _refused(capsys, "--op", "batchnorm", "--eps", "0", "--mode", "train").strip().splitlines() == [
        "normcheck: error: batchnorm takes eps > 0 in train mode (torch refuses eps = 0 where it normalises with the "
        "batch's variance); eps = 0 is legal in eval mode"]
    assert "--case names the whole case; drop --eps" in _refused(capsys, "--op", "batchnorm", "--case", "v3.x.y",
                                                                  "--eps", "0.1")


def test_affine_none_unfreezes_what_the_sweep_froze_and_a_conflict_is_refused(capsys):
    cases = default_sweep("layernorm", narrowing=Narrowing.of({"affine": False}))
    assert all(c.affine is False and c.frozen == "none" for c in cases)
    assert any(c.frozen != "none" for c in default_sweep("layernorm"))  # (the sweep froze some)
    refused = _refused(capsys, "--op", "batchnorm", "--affine", "none", "--frozen", "params")
    assert "--frozen params: the case has no parameters to freeze" in refused


# --------------------------------------------------------------------------- channels-first sets
CHANNELS = {"normalized_at": "channels"}


def test_channels_first_layers_pass_their_sweep_declared_and_fail_it_as_trailing():
    convnext = f"{LAYERS}:convnext_layer_norm"
    assert verdicts("layernorm", convnext, {**CHANNELS, "output_dtype": "promote"})["failed"] == []
    assert verdicts("layernorm", convnext, {"output_dtype": "promote"}, first_failure=True)["failed"]  # as last dims
    small = verdicts("rmsnorm", f"{LAYERS}:channels_first_rms_norm", CHANNELS, lambda c: c.numel < 100_000)
    assert small["ran"] > 40 and small["failed"] == []


def test_a_channels_first_case_normalises_dims_1_to_k_and_the_sweep_lays_it_out_so():
    case = Case("layernorm", (2, 3, 4, 5), normalized_dims=2, normalized_at="channels")
    view = case.view
    assert (view.set_count, view.set_size, view.param_shape, view.stats_shape) == (10, 12, (3, 4), (2, 1, 1, 5))
    x = np.arange(120.0).reshape(case.shape)
    sets = view.to_sets(x)
    assert np.array_equal(sets[7], x[1, :, :, 2].ravel()) and np.array_equal(view.from_sets(sets), x)
    for c in default_sweep("layernorm", follows=tuple(CHANNELS.items())):
        assert c.normalized_at == "channels" and c.view.param_shape == c.shape[1:1 + c.normalized_dims]


def test_the_array_contract_takes_channels_first_axes():
    pytest.importorskip("jax", reason="needs the jax extra (pip install -e \".[jax]\")")
    impl = resolve_impl("layernorm", "tests._array_impls:jax_layer_norm", framework="jax")
    sweep = [c for c in default_sweep("layernorm", follows=tuple(CHANNELS.items()), formats=impl.impl.formats)
             if c.numel < 50_000][:8]
    reports = [judge(c, impl) for c in sweep]
    assert len(reports) == 8 and all(r.verdict in (PASS, MISTRUSTED) for r in reports), [r.summary() for r in reports]


def test_torchs_records_follow_the_trailing_dims(capsys):
    refused = _refused(capsys, "--op", "layernorm", "--normalized-at", "channels")
    assert "--normalized-at channels: torch follows normalized_at=trailing" in refused


# --------------------------------------------------------------------------- casting chains
CHAINS = {"end": "rms_end", "before-weight": "rms_before_weight", "rstd-input": "rms_rstd_input"}


def half(case) -> bool:
    """The rows where chains can differ at all (rounding to f32 or f64 is below every budget); not one-element sets
    with eps = 0, where rstd = 1/|x| overflows the rstd-input chain's half-precision rstd and the test layers'
    straight-through rounding gives dx = inf · 0 = NaN (their arithmetic, not a chain's)."""
    return case.dtype in ("f16", "bf16") and not (case.eps == 0 and case.view.set_size == 1)


@pytest.mark.parametrize("chain", CHAINS)
def test_every_casting_chain_passes_as_itself_and_fails_as_every_other(chain):
    spec = f"{LAYERS}:{CHAINS[chain]}"
    assert verdicts("rmsnorm", spec, {"casting": chain}, half)["failed"] == []
    for other in CHAINS:
        if other != chain:
            assert verdicts("rmsnorm", spec, {"casting": other}, first_failure=True)["failed"], (chain, other)


def test_t5_and_gemma_style_layers_pass_as_declared_and_fail_otherwise():
    t5 = f"{LAYERS}:t5_rms_norm"
    assert verdicts("rmsnorm", t5, {"output_dtype": "promote"}, half)["failed"] == []
    assert verdicts("rmsnorm", t5, {"casting": "before-weight", "output_dtype": "promote"}, first_failure=True)["failed"]
    gemma = f"{LAYERS}:gemma_rms_norm"
    assert verdicts("rmsnorm", gemma, {"weight_offset": 1.0}, half)["failed"] == []
    assert verdicts("rmsnorm", gemma, {}, first_failure=True)["failed"]
