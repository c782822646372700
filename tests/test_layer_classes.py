"""Layers given by their class (or a factory), with no adapter code: normcheck builds each from the case by its
constructor's argument names, binds the case's weight, bias and running statistics by role, and judges forward like a
function. Correct layers pass with the declarations their source implies; each broken one fails for its own
deviation; a case the constructor cannot express is a SKIP saying which argument is missing."""
from dataclasses import replace

import numpy as np
import pytest

from normcheck import Case, UsageError, compare, resolve_impl
from normcheck.cli import main
from normcheck.engine import judge
from normcheck.engine.normalises import not_a_norm
from normcheck.engine.report import FAIL, KNOWN, PASS, SKIP

LAYERS = "tests._layer_classes"
OK = (PASS, "MISTRUSTED")


def judged(op, layer, case):
    return compare(op, f"{LAYERS}:{layer}" if isinstance(layer, str) else layer, case)


# -- torch's own classes, by spec: every family builds from its constructor -----------------------------------------
@pytest.mark.parametrize("op, spec, case", [
    ("layernorm", "torch.nn:LayerNorm", Case("layernorm", (4, 6, 10), "f64", normalized_dims=2)),
    ("layernorm", "torch.nn:LayerNorm", Case("layernorm", (4, 6, 10), "f32", affine="weight")),
    ("rmsnorm", "torch.nn:RMSNorm", Case("rmsnorm", (5, 16), "f32", eps=None)),
    ("groupnorm", "torch.nn:GroupNorm", Case("groupnorm", (2, 6, 5, 5), "f64", groups=3)),
    ("groupnorm", "torch.nn:GroupNorm", Case("groupnorm", (2, 6, 5, 5), "f32", groups=2, affine="weight")),
    ("batchnorm", "torch.nn:BatchNorm2d", Case("batchnorm", (4, 3, 5, 5), "f64")),
    ("batchnorm", "torch.nn:BatchNorm2d", Case("batchnorm", (4, 3, 5, 5), "f32", mode="eval")),
    ("instancenorm", "torch.nn:InstanceNorm2d", Case("instancenorm", (2, 3, 5, 5), "f64")),
])
def test_torch_classes_pass(op, spec, case):
    report = compare(op, spec, case)
    assert report.verdict in OK, report.summary()


@pytest.mark.parametrize("op, spec, case, why", [
    ("layernorm", f"{LAYERS}:ChannelsFirstLayerNorm",
     Case("layernorm", (2, 6, 5, 5), "f32", affine="weight", normalized_at="channels"),
     "gives weight and bias together (affine)"),
    ("layernorm", "torch.nn:LayerNorm", Case("layernorm", (4, 6, 10), "f32", affine="bias"),
     "cannot give a bias without a weight"),
    ("batchnorm", "torch.nn:BatchNorm2d", Case("batchnorm", (4, 3), "f32"), "takes other input ranks"),
])
def test_cases_a_constructor_cannot_express_skip(op, spec, case, why):
    report = compare(op, spec, case)
    assert report.verdict == SKIP and why in report.message, report.summary()


# -- layers as model libraries write them ---------------------------------------------------------------------------
LLAMA = dict(casting="before-weight", output_dtype="promote", compute_dtype="f32")


@pytest.mark.parametrize("dtype, param", [("f32", None), ("bf16", None), ("bf16", "f32"), ("f16", "f32"), ("f64", None)])
def test_llama_style_rmsnorm_passes_declared(dtype, param):
    report = judged("rmsnorm", "LlamaStyleRMSNorm", Case("rmsnorm", (6, 64), dtype, param, **LLAMA))
    assert report.verdict in OK, report.summary()


def test_eps_none_gives_the_layer_the_number_it_means():
    """A constructor takes a number: a case that leaves eps to the dtype hands it the number that means there."""
    report = judged("rmsnorm", "LlamaStyleRMSNorm", Case("rmsnorm", (6, 64), "f64", eps=None, profile="tiny", **LLAMA))
    assert report.verdict in OK, report.summary()


def test_half_statistics_fail_where_llama_passes():
    case = Case("rmsnorm", (6, 4096), "bf16", "f32", profile="offset", **LLAMA)
    assert judged("rmsnorm", "LlamaStyleRMSNorm", case).verdict in OK
    assert judged("rmsnorm", "BrokenHalfStatisticsRMSNorm", case).verdict == FAIL


def test_one_size_constructor_skips_several_normalised_dims():
    report = judged("rmsnorm", "LlamaStyleRMSNorm", Case("rmsnorm", (2, 3, 8), "f32", normalized_dims=2, **LLAMA))
    assert report.verdict == SKIP and "takes one size (hidden_size)" in report.message


def test_a_layer_with_a_weight_skips_cases_without_one():
    report = judged("rmsnorm", "LlamaStyleRMSNorm", Case("rmsnorm", (2, 8), "f32", affine=False, **LLAMA))
    assert report.verdict == SKIP and "always has a weight" in report.message


def test_gemma_style_needs_its_weight_offset():
    case = Case("rmsnorm", (4, 32), "bf16", "f32", compute_dtype="f32")
    assert judged("rmsnorm", "GemmaStyleRMSNorm", case).verdict == FAIL
    from dataclasses import replace
    assert judged("rmsnorm", "GemmaStyleRMSNorm", replace(case, weight_offset=1.0)).verdict in OK


def test_gemma_style_forward_mode_passes_where_w_is_near_minus_one():
    """Its f32 1 + w adds 1 to w rounded to float32, which moves w + 1 by u·|w| however near 0 it is: y's baseline
    formed γ so and passed, the JVP's formed w + 1 in float64 and failed jvp_y (3.89 budgets here, |1 + w| ~ 1e-4 in a
    near-constant row). The twin holding w in bfloat16 still fails, jvp_y too."""
    case = Case("rmsnorm", (4, 64), "f64", profile="near_constant", seed=1, weight_offset=1.0, compute_dtype="f32",
                order="fwd")
    assert judged("rmsnorm", "GemmaStyleRMSNorm", case).verdict in OK
    broken = judge(case, resolve_impl("rmsnorm", f"{LAYERS}:BrokenGemmaStyleRMSNorm", hints=False))
    assert broken.verdict == FAIL and {t.name for t in broken.tensors if t.verdict == FAIL} >= {"y", "jvp_y"}


@pytest.mark.parametrize("shape, fmt", [((2, 6, 5, 7), "contiguous"), ((2, 6, 5, 7), "channels_last"),
                                        ((3, 4, 9), "contiguous")])
def test_channels_first_layernorm(shape, fmt):
    case = Case("layernorm", shape, "f32", x_format=fmt, normalized_at="channels")
    assert judged("layernorm", "ChannelsFirstLayerNorm", case).verdict in OK
    assert judged("layernorm", "BrokenLastDimLayerNorm", case).verdict == FAIL


def test_frozen_batchnorm_promotes_through_its_running_statistics():
    """Mixed precision: y = x·scale + shift with float32 buffers is float32, which promote now means."""
    case = Case("batchnorm", (4, 3, 5, 5), "bf16", "f32", mode="eval", output_dtype="promote")
    assert judged("batchnorm", "FrozenBatchNorm2d", case).verdict in OK
    assert judged("batchnorm", "BrokenFrozenBatchNorm2d", case).verdict == FAIL


def test_frozen_batchnorm_binds_buffers_as_parameters():
    """Its weight and bias are buffers: bound by role all the same, and their gradients come back."""
    report = judged("batchnorm", "FrozenBatchNorm2d", Case("batchnorm", (4, 3, 5, 5), "f64", mode="eval"))
    assert report.verdict in OK and {"dweight", "dbias"} <= {t.name for t in report.tensors}


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_reassigned_running_statistics_are_read_back(mode):
    report = judged("batchnorm", "ReassigningBatchNorm", Case("batchnorm", (6, 3, 4), "f64", mode=mode))
    assert report.verdict in OK, report.summary()
    assert {"running_mean", "running_var"} <= {t.name for t in report.tensors}


def test_add_rmsnorm_module_takes_the_residual():
    report = judged("add_rmsnorm", "AddRMSNorm", Case("add_rmsnorm", (4, 32), "f32"))
    assert report.verdict in OK, report.summary()


def test_a_factory_builds_an_unusual_constructor():
    report = judged("layernorm", "make_configured_norm", Case("layernorm", (4, 6, 10), "f64"))
    assert report.verdict in OK, report.summary()


def test_a_constructor_normcheck_cannot_fill_is_one_line():
    with pytest.raises(UsageError, match=r"cannot fill its constructor's argument config .*give a factory"):
        compare("layernorm", f"{LAYERS}:ConfiguredNorm", Case("layernorm", (4, 10), "f32"))


def test_a_fixed_eps_skips_other_eps():
    assert judged("layernorm", "FixedEpsLayerNorm", Case("layernorm", (4, 10), "f32", eps=1e-5)).verdict in OK
    report = judged("layernorm", "FixedEpsLayerNorm", Case("layernorm", (4, 10), "f32", eps=1e-2))
    assert report.verdict == SKIP and "fixes eps at 1e-05" in report.message


def test_a_class_object_works_like_its_spec():
    from tests._layer_classes import LlamaStyleRMSNorm
    assert compare("rmsnorm", LlamaStyleRMSNorm, Case("rmsnorm", (3, 16), "f32", **LLAMA)).verdict in OK


def test_distributed_ops_take_functions_only():
    with pytest.raises(UsageError, match="single-process ops"):
        compare("syncbn", "torch.nn:BatchNorm2d", Case("syncbn", (4, 3, 5, 5), "f32", split=(2, 2)))


def test_the_cli_sweeps_a_layer_class(capsys):
    """The default sweep of torch's own LayerNorm class, as a user would run it: no FAIL, and no SKIP: what its
    constructor cannot express (a bias without a weight) narrows the design, and the run says so first; known issues
    of torch's kernels follow into it as for any code that calls them."""
    status = main(["compare", "--op", "layernorm", "--impl", "torch.nn:LayerNorm", "--order", "1"])
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    lines = out.splitlines()
    assert lines[0].startswith("narrowed: path (not bias only") and "cannot give a bias without a weight" in lines[0]
    assert "SKIP" not in out and "passed" in lines[-1]
    pairs = lines[-1].split("; ")[1]
    judged, designed = (int(n) for n in pairs.split(" pairs judged")[0].split(" of "))
    assert 0 < judged < designed and "path=bias only: narrowed away" in lines[-1]


def test_promote_counts_a_bias_only_layer():
    """A bias-only layer adds its float32 bias to half x: result_type(x, bias) is float32."""
    case = Case("layernorm", (4, 32), "bf16", "f32", affine="bias", output_dtype="promote", compute_dtype="f32")
    assert compare("layernorm", "tests._real_layers:promoting_layer_norm", case).verdict in OK



def test_the_annotated_transformers_layer_norm_class_is_built_and_judged_as_it_is_written():
    """Its parameters are a_2 and b_2 (it SKIPped every case: no weight by any name the binder knew); judged on its op,
    layernorm_std, it passes, and on LayerNorm's, whose statistic it does not form, it fails."""
    case = Case("layernorm_std", (6, 32), "f64", eps=1e-6)
    assert judged("layernorm_std", "AnnotatedTransformerLayerNorm", case).verdict in OK
    wrong = judged("layernorm", "AnnotatedTransformerLayerNorm", Case("layernorm", (6, 32), "f64", eps=1e-6))
    assert wrong.verdict == FAIL


# -- issue 62: gated and grouped ops, conditioning projections, sizes, arguments through **kwargs, constants ---------
F32_STATISTICS = dict(compute_dtype="f32")


def test_the_contracts_optional_argument_is_parsed_as_one():
    """`eps[, group_size]` is eps and an optional group_size (it was parsed into 'eps[' and 'group_size]'); a function
    without group_size fits the contract and declines the grouped cases only."""
    from normcheck.core.loading import check_arity, contract_arguments
    from normcheck.ops import get_op
    signature = get_op("gate_rmsnorm").signature
    arguments = contract_arguments(signature)
    assert arguments.positional == ("input", "gate", "normalized_shape", "weight", "eps")
    assert arguments.optional == ("group_size",)
    assert contract_arguments(get_op("grouped_rmsnorm").array_signature).keywords == ("axes", "eps")

    def ungrouped(input, normalized_shape, weight, eps):
        return input
    check_arity("ungrouped", ungrouped, get_op("grouped_rmsnorm").signature)


@pytest.mark.parametrize("op", ["gate_rmsnorm", "rmsnorm_gate"])
def test_a_gated_layer_with_groups_is_judged_by_class(op):
    """Mamba2's RMSNormGated by class: its gate `z` is the op's gate, group_size and eps reach its constructor, and
    norm_before_gate is set for the op (the gate before the norm or after it); the twin whose groups are strided
    fails."""
    case = Case(op, (4, 24), "f64", group_size=6, eps=1e-3, **F32_STATISTICS)
    assert judged(op, "GroupedGatedRMSNorm", case).verdict in OK, judged(op, "GroupedGatedRMSNorm", case).summary()
    assert judged(op, "BrokenGroupedGatedRMSNorm", case).verdict == FAIL


@pytest.mark.parametrize("groups", [{}, {"group_size": 4}], ids=["no groups", "groups of 4"])
def test_a_required_group_size_is_the_whole_row_where_a_case_has_no_groups(groups):
    """A constructor that requires group_size (transformers' Mamba2 gated norm) is built: with the case's group size,
    or the row's length where the case has none (one group, the ungrouped norm); it was a usage error."""
    case = Case("gate_rmsnorm", (3, 16), "f32", eps=1e-6, **LLAMA, **groups)
    report = judged("gate_rmsnorm", "RequiredGroupsGatedRMSNorm", case)
    assert report.verdict in OK, report.summary()


def test_a_forward_parameter_named_gate_takes_the_gate():
    """transformers' Mamba2 gated norm names it `gate` (it was dropped: 'dgate is None'); its gate comes first, so
    it passes gate_rmsnorm and fails rmsnorm_gate."""
    case = dict(shape=(4, 16), dtype="f32", eps=1e-6, **LLAMA)
    assert judged("gate_rmsnorm", "GateFirstRMSNorm", Case("gate_rmsnorm", **case)).verdict in OK
    assert judged("rmsnorm_gate", "GateFirstRMSNorm", Case("rmsnorm_gate", **case)).verdict == FAIL


def test_a_factory_requiring_eps_and_a_layer_without_group_size():
    """eps reaches a factory that requires it (it raised on every row), group_size too; a layer without group_size
    declines the grouped cases, saying so."""
    case = Case("grouped_rmsnorm", (4, 12), "f32", group_size=3, eps=1e-3)
    assert judged("grouped_rmsnorm", "make_grouped_rms_norm", case).verdict in OK
    report = judged("grouped_rmsnorm", "LlamaStyleRMSNorm", case)
    assert report.verdict == SKIP and "takes no group_size" in report.message


@pytest.mark.parametrize("layer", ["ConditionedLayerNorm", "make_conditioned_layer_norm"])
def test_a_layer_conditioned_through_a_projection_is_one_line(layer):
    """diffusers' AdaLayerNorm: its Linear's weight is not the norm's (it was bound as the weight, and every case
    SKIPped after building a Linear(D, 2D)); one line says what normcheck cannot bind: from the class's source when it
    is given, from the module a factory returns on the first case."""
    with pytest.raises(UsageError, match=r"its forward takes timestep and temb, which the op's contract does not pass, "
                                         r"and its linear \(Linear.*\) projects a conditioning input"):
        judged("adaln", layer, Case("adaln", (4, 8), "f32"))


def test_binding_by_role_skips_projections():
    import torch
    from normcheck.frameworks.torch.layers import _find
    module = torch.nn.Module()
    module.proj, module.norm = torch.nn.Linear(4, 8), torch.nn.LayerNorm(4)
    assert _find(module, ("weight",))[2] == "norm.weight"


@pytest.mark.parametrize("layer, at", [("ChannelsFirstOneSizeLayerNorm", "channels"),
                                       ("LastDimOneSizeLayerNorm", "trailing")])
def test_a_one_int_normalized_shape_skips_several_dims(layer, at):
    """ViTDet's and ConvNeXt's `normalized_shape` is one int (kept as (normalized_shape,)): one dim passes (ConvNeXt's
    failed on the 1-tuple it was given), several SKIP (they FAILed)."""
    shape = (2, 6, 5, 5)
    assert judged("layernorm", layer, Case("layernorm", shape, "f64", normalized_at=at, eps=1e-6)).verdict in OK
    report = judged("layernorm", layer, Case("layernorm", shape, "f64", normalized_at=at, normalized_dims=2))
    assert report.verdict == SKIP and "takes one size (normalized_shape)" in report.message, report.summary()


@pytest.mark.parametrize("op, layer", [("layernorm", "ChannelsNamedLayerNorm"), ("rmsnorm", "ShapeAnnotatedRMSNorm")])
def test_a_shape_under_another_name_takes_several_dims(op, layer):
    """timm's LayerNorm hands num_channels to nn.LayerNorm's normalized_shape; an annotated `dim: int | tuple`: both
    take a shape (they SKIPped: 'takes one size')."""
    assert judged(op, layer, Case(op, (2, 6, 5), "f64", normalized_dims=2, eps=1e-6)).verdict in OK


def test_arguments_through_kwargs_reach_the_parent_and_a_fixed_group_count_skips():
    """timm's GroupNorm1 passes eps through **kwargs to nn.GroupNorm (its default was used silently), and fixes one
    group: other group counts SKIP, as do a factory's constants (Flux's GroupNorm(32, C, eps=1e-6))."""
    assert judged("groupnorm", "SingleGroupNorm", Case("groupnorm", (2, 6, 5), "f64", groups=1, eps=1e-2)).verdict in OK
    report = judged("groupnorm", "SingleGroupNorm", Case("groupnorm", (2, 6, 5), "f64", groups=3))
    assert report.verdict == SKIP and "fixes num_groups at 1" in report.message
    report = judged("groupnorm", "make_group_norm32", Case("groupnorm", (2, 6, 5), "f64", groups=3, eps=1e-6))
    assert report.verdict == SKIP and "fixes num_groups at 32" in report.message


@pytest.mark.parametrize("op, layer, eps, declared", [
    ("rmsnorm", "LiteralEpsRMSNorm", 1e-6, LLAMA),
    ("layernorm", "LiteralEpsLayerNorm", 1e-5, dict(affine=False, **F32_STATISTICS)),
    ("batchnorm", "LiteralEpsFrozenBatchNorm2d", 1e-5, dict(mode="eval")),
])
def test_an_eps_written_in_forward_skips_other_eps(op, layer, eps, declared):
    """Flux's `+ 1e-6`, OLMo's `eps=1e-5`, DETR's `eps = 1e-5` in forward: the case with that eps passes, another
    SKIPs naming it (they FAILed)."""
    shape = (2, 3, 4, 4) if op == "batchnorm" else (4, 16)
    assert judged(op, layer, Case(op, shape, "f32", eps=eps, **declared)).verdict in OK
    report = judged(op, layer, Case(op, shape, "f32", eps=1e-3, **declared))
    assert report.verdict == SKIP and f"fixes eps at {eps:g} (its forward's code writes it" in report.message


def test_a_scalar_gain_binds_to_the_cases_one_value():
    """ScaleNorm's g as the paper writes it, a 0-d parameter (every row SKIPped: 'shape (); the case's is (1,)')."""
    report = judged("scalenorm", "ScalarGainScaleNorm", Case("scalenorm", (4, 16), "f64"))
    assert report.verdict in OK and "dweight" in {t.name for t in report.tensors}, report.summary()


# -- torch's known issues through a class: the same kernel, the same case, one verdict ------------------------------
# x channels-last with odd size-1 strides, dy contiguous: torch's batch_norm backward reads dy in x's layout
SIZE1_STRIDES = Case("batchnorm", (1, 8, 1, 7), "f64", x_format="channels_last_size1", dy_format="contiguous")


@pytest.mark.parametrize("op, layer, case, issue", [
    ("batchnorm", "torch.nn:BatchNorm2d", SIZE1_STRIDES, "torch-bn-size1-strides"),
    ("batchnorm", f"{LAYERS}:TimmStyleBatchNorm2d", SIZE1_STRIDES, "torch-bn-size1-strides"),
    ("instancenorm", "torch.nn:InstanceNorm2d", Case("instancenorm", (1, 8, 1, 3), "f64", x_format="channels_last"),
     "torch-in-batch-of-one-channels-last-dy"),
    # the worker dies in torch's kernel: the kernels it had called are read from its journal
    ("groupnorm", "torch.nn:GroupNorm", Case("groupnorm", (2, 3, 1, 7), "f16", x_format="channels_last",
                                             dy_format="contiguous", groups=3, affine="weight", frozen="x"),
     "torch-gn-frozen-x-channels-last-crash"),
])
def test_torch_known_issues_through_a_class_are_known(op, layer, case, issue):
    """A class that calls torch's kernel on the case's tensors fails as torch's own record does there: KNOWN, as
    through torch's record and F.* (they were FAIL: issues without kernels named, and a worker death that took
    the record of the kernels it had called with it)."""
    report = judge(case, resolve_impl(op, layer, hints=False))
    assert report.verdict == KNOWN and report.message.startswith(f"known issue {issue}"), report.summary()


def test_a_class_wrong_where_torchs_kernel_is_wrong_still_fails():
    report = judge(SIZE1_STRIDES, resolve_impl("batchnorm", f"{LAYERS}:BrokenGradientBatchNorm2d", hints=False))
    assert report.verdict == FAIL and "does not reproduce it" in report.message, report.summary()


# -- a layer none of normcheck's ops describes: one line, not a FAIL row per case ----------------------------------
def test_a_layer_no_op_describes_ends_the_run_with_one_line(capsys):
    """DyT (γ·tanh(αx) + β) fails its first cases far beyond any convention; the probe finds its y element-wise (x
    moved at half of its elements leaves y at the others as it was), and the run stops there (it printed a FAIL row
    for each of its 699 cases)."""
    status = main(["compare", "--op", "layernorm", "--impl", f"{LAYERS}:DyT", "--no-hints", "--dtype", "f32", "--order", "1"])
    out, err = capsys.readouterr()
    assert status == 1 and sum(line.startswith("FAIL") for line in out.splitlines()) == 3, out
    assert f"{LAYERS}:DyT is not a layernorm: its y is element-wise" in err and "cases ran" in err, err


@pytest.mark.parametrize("layer, op", [("AnnotatedTransformerLayerNorm", "layernorm"),  # another statistic
                                       ("BrokenLastDimLayerNorm", "layernorm"),  # the wrong set
                                       ("BrokenGemmaStyleRMSNorm", "rmsnorm")])  # a coarse weight
def test_a_wrong_norm_is_still_a_norm(layer, op):
    """What the probe asks of a layer is that it computes over its sets at all: a norm that is wrong passes it and
    gets its FAIL rows; DyT does not."""
    case = Case(op, (4, 6, 10), "f32", normalized_at="channels") if "LastDim" in layer else Case(op, (6, 32), "f32")
    assert not_a_norm(case, resolve_impl(op, f"{LAYERS}:{layer}", hints=False)) is None
    assert f"is not a {op}" in not_a_norm(Case(op, (6, 32), "f32"), resolve_impl(op, f"{LAYERS}:DyT", hints=False))


# -- another op's layer: one line naming the op, not a FAIL row per case (issue 62) ----------------------------------
def test_a_layer_of_another_op_ends_the_run_with_one_line(capsys):
    """timm's SimpleNorm (x · rsqrt(var(x) + eps) · w) run as rmsnorm fails its first cases, which no convention
    explains; judged as simplenorm's they pass, and the run stops there (timm's own class printed 683 FAIL rows)."""
    status = main(["compare", "--op", "rmsnorm", "--impl", f"{LAYERS}:TimmSimpleNorm", "--no-hints", "--dtype", "f32",
                   "--order", "1", "--profile", "normal"])
    out, err = capsys.readouterr()
    assert status == 1 and sum(line.startswith("FAIL") for line in out.splitlines()) == 3, out
    assert (f"{LAYERS}:TimmSimpleNorm is not rmsnorm: its first 3 cases failed as rmsnorm's; as --op simplenorm's, "
            "3 pass and none fails by its values") in err and "run it with --op simplenorm" in err, err


@pytest.mark.parametrize("op, layer, named", [
    ("layernorm", "AnnotatedTransformerLayerNorm", "layernorm_std"),
    ("rmsnorm", ("rmsnorm_eps_out", "CORRECT", "composed"), "rmsnorm_eps_out"),  # (tests/mutants/: its textbook)
    ("rmsnorm", ("rmsnorm", "MUTANTS", "drop_xhat_term"), None),  # a wrong RMSNorm
    ("layernorm", "DyT", None),  # no norm at all
], ids=["annotated-layernorm", "eps-outside-rmsnorm", "dx-without-xhat-rmsnorm", "dyt"])
def test_another_op_is_named_only_where_its_cases_pass(op, layer, named):
    """The annotated transformer's LayerNorm run as layernorm is layernorm_std's, a textbook RMSNorm with eps outside
    the root run as rmsnorm rmsnorm_eps_out's; an RMSNorm whose dx lost its x̂ term is no op's (its cases fail by
    their values as each of rmsnorm_eps_out's, rmsnorm_l2's and simplenorm's), nor is DyT."""
    from normcheck.engine.other_op import another_op
    from tests.mutants import CATALOGUE, bound
    if isinstance(layer, tuple):  # (a catalogue's function, under `op`'s contract)
        owner, kind, name = layer
        impl = bound(op, getattr(CATALOGUE[owner], kind)[name].target)
    else:
        impl = resolve_impl(op, f"{LAYERS}:{layer}", hints=False)
    cases = [Case(op, shape, "f32", seed=seed) for seed, shape in enumerate([(6, 32), (3, 7, 16), (2, 50)])]
    reports = [judge(case, impl) for case in cases]
    assert [r.verdict for r in reports] == [FAIL] * 3
    line = another_op(reports, impl)
    assert (line is None) if named is None else f"as --op {named}'s, 3 pass" in line, line


def test_a_case_moves_to_another_op_only_as_the_same_call():
    """A case is another op's where that op takes its inputs as they are (eps=None as the number it means, where the
    other op needs one): not with a convention set otherwise than its op's default (Gemma's weight offset), nor with
    the weight shaped otherwise (scalenorm's one gain)."""
    from normcheck.engine.other_op import as_op
    from normcheck.ops import OPS
    case = Case("rmsnorm", (4, 16), "f32")
    assert as_op(case, OPS["simplenorm"]) == Case("simplenorm", (4, 16), "f32")
    default = case.with_(eps=None)
    assert as_op(default, OPS["simplenorm"]) == Case("simplenorm", (4, 16), "f32", eps=default.eps_value)
    assert as_op(case.with_(weight_offset=1.0), OPS["simplenorm"]) is None
    assert as_op(case, OPS["scalenorm"]) is None


# -- F.normalize's and mmpose's forms (issue 62): declared, 0 adapter lines; each wrong twin fails ---------------------
@pytest.mark.parametrize("op, layer, declared", [
    ("rmsnorm_l2", "NormalizeRMSNorm", dict(eps=1e-12, profile="near_constant")),
    ("rmsnorm_l2", "UnitOffsetRMSNorm", dict(eps=1e-12, weight_offset=1.0)),
    ("scalenorm", "NormalizeScaleNorm", dict(eps=1e-12, eps_at="normalize", profile="near_constant")),
    ("scalenorm", "RMSFloorScaleNorm", dict(eps=1e-2, eps_at="rms", profile="near_constant")),
])
def test_normalize_and_rms_floor_layers_pass_declared(op, layer, declared):
    """lucidrains' F.normalize(x)·√d·g, x-transformers' unit_offset and ScaleNorm, mmpose's x / max(‖x‖/√d, eps)·g
    (each FAILed: ScaleNorm's y off by √d, the RMSNorms' floor not F.normalize's)."""
    assert judged(op, layer, Case(op, (4, 16), "f32", **declared)).verdict in OK


@pytest.mark.parametrize("op, layer, declared", [
    ("rmsnorm_l2", "BrokenNormalizeRMSNorm", dict(eps=1e-12)),
    ("scalenorm", "BrokenRMSFloorScaleNorm", dict(eps=1e-2, eps_at="rms", profile="near_constant")),
    ("scalenorm", "RMSFloorScaleNorm", dict(eps=1e-2, eps_at="floor", profile="near_constant")),
])
def test_their_wrong_twins_fail(op, layer, declared):
    assert judged(op, layer, Case(op, (4, 16), "f32", **declared)).verdict == FAIL


# -- what a forward writes (issue 62): the dims it reduces over, F.normalize's eps, a broadcast shape -----------------
DIFFUSERS = dict(compute_dtype="f32", output_dtype="promote")
FROZEN = dict(mode="eval", output_dtype="promote", eps=1e-5)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_a_forward_reducing_over_the_last_dim_skips_several_dims_whatever_its_constructor_takes(dims):
    """diffusers' RMSNorm and MochiRMSNorm: `dim` takes a shape (torch.ones(dim)), but the mean of squares is over the
    last dim only (mean(-1)): one dim passes, several SKIP naming the reduction (they FAILed: 25 rows of each one's
    default sweep). Its twin that flattens the dims of its shape first normalises them all and passes."""
    case = Case("rmsnorm", (2, 3, 4, 8), "f32", normalized_dims=dims, eps=1e-6, **DIFFUSERS)
    report = judged("rmsnorm", "TrailingDimRMSNorm", case)
    if dims == 1:
        assert report.verdict in OK, report.summary()
    else:
        assert report.verdict == SKIP and ("forward reduces over one dim (mean(-1)): it normalises one dim, the case "
                                           f"{dims} dims") in report.message, report.summary()
    assert judged("rmsnorm", "FlattenedTrailingDimsRMSNorm", case).verdict in OK


def test_the_dims_a_forward_reduces_over_are_read_from_its_source():
    from normcheck.frameworks.torch.layer_source import reduced_dims
    from tests import _layer_classes as L
    assert reduced_dims(L.TrailingDimRMSNorm.forward) == (1, "mean(-1)")
    assert reduced_dims(L.LiteralEpsRMSNorm.forward) == (1, "mean(-1)")          # (torch.mean(h ** 2, dim=-1))
    assert reduced_dims(L.NormalizeRMSNorm.forward) == (1, "normalize(-1)")
    assert reduced_dims(L.ChannelsFirstOneSizeLayerNorm.forward) == (1, "mean(1)")
    assert reduced_dims(L.ChannelsFirstLayerNorm.forward)[0] == 1                 # (normalized_shape=(x.shape[-1],))
    for layer in ("FlattenedTrailingDimsRMSNorm", "ShapeAnnotatedRMSNorm", "FixedEpsLayerNorm", "ReassigningBatchNorm",
                  "GroupedGatedRMSNorm"):  # (flattened first, a shape given to the norm, dims it computes, groups)
        assert reduced_dims(getattr(L, layer).forward) is None, layer
    import torch
    assert reduced_dims(torch.nn.LayerNorm.forward) is None and reduced_dims(torch.nn.RMSNorm.forward) is None


@pytest.mark.parametrize("op, layer, eps_at", [("rmsnorm_l2", "NormalizeRMSNorm", {}),
                                               ("scalenorm", "NormalizeScaleNorm", {"eps_at": "normalize"})])
def test_f_normalizes_default_eps_is_the_layers_fixed_eps(op, layer, eps_at):
    """lucidrains' and x-transformers' F.normalize(x, dim=-1) passes no eps: its default, 1e-12, is the layer's own,
    and a case with another SKIPs naming it (it FAILed where the data's statistic is about eps); a layer that passes
    F.normalize its constructor's eps takes the case's."""
    case = Case(op, (4, 16), "f32", eps=1e-5, profile="near_constant", **eps_at)
    report = judged(op, layer, case)
    assert report.verdict == SKIP and "fixes eps at 1e-12 (its forward's code writes it" in report.message, \
        report.summary()
    assert judged(op, layer, case.with_(eps=1e-12)).verdict in OK
    if op == "rmsnorm_l2":
        assert judged(op, "EpsNormalizeRMSNorm", case).verdict in OK


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 4, 2)])
def test_a_forward_broadcasting_for_4d_input_skips_other_ranks(shape):
    """DETR's frozen BatchNorm reshapes its buffers to (1, -1, 1, 1): on input of another rank y came back of another
    shape (436 FAIL rows of its default sweep, declared); those rows SKIP naming the shape, 4-D ones pass. A BatchNorm
    whose broadcast shape follows x.dim() takes each rank."""
    report = judged("batchnorm", "LiteralEpsFrozenBatchNorm2d", Case("batchnorm", shape, "f32", **FROZEN))
    assert report.verdict == SKIP and ("forward is written for its input's rank (reshape(1, -1, 1, 1)): it "
                                       f"takes 4-D input, the case's is {len(shape)}-D") in report.message
    four_d = Case("batchnorm", (4, 3, 5, 5), "f32", **FROZEN)
    assert judged("batchnorm", "LiteralEpsFrozenBatchNorm2d", four_d).verdict in OK
    assert judged("batchnorm", "ReassigningBatchNorm", Case("batchnorm", shape, "f64", mode="eval")).verdict in OK


@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 3, 4, 4, 2)])
def test_a_forward_that_permutes_four_dims_skips_other_ranks(shape):
    """timm's LayerNorm2d permutes (N, C, H, W) to channels-last and back: on input of another rank permute raised
    (617 FAIL rows of its default sweep); those rows SKIP naming the permutation, and 4-D ones pass channels-first."""
    report = judged("layernorm", "PermutedLayerNorm2d", Case("layernorm", shape, "f32", normalized_at="channels"))
    assert report.verdict == SKIP and "(permute(0, 2, 3, 1)): it takes 4-D input" in report.message, report.summary()
    four_d = Case("layernorm", (2, 3, 4, 5), "f32", normalized_at="channels")
    assert judged("layernorm", "PermutedLayerNorm2d", four_d).verdict in OK


@pytest.mark.parametrize("op, layer, declared, factor, taken", [
    ("rmsnorm", "TrailingDimRMSNorm", DIFFUSERS, "normalized_dims", (1,)),
    ("batchnorm", "LiteralEpsFrozenBatchNorm2d", dict(mode="eval", output_dtype="promote"), "rank", (4,)),
])
def test_what_a_forward_writes_narrows_the_sweep(op, layer, declared, factor, taken):
    """The limits a forward's code sets narrow the design as a constructor's do: the sweep judges only the dims or the
    rank the layer takes (and the run says why), every other factor kept."""
    from normcheck.cases.narrowing import Narrowing
    from normcheck.cases.sweep import default_sweep
    from normcheck.impls.limits import learned
    from normcheck.ops import get_op
    narrowing = learned(get_op(op), resolve_impl(op, f"{LAYERS}:{layer}"), Narrowing.of(declared, scans="without"))
    limit = next(lim for lim in narrowing.limits if lim.name == factor)
    assert limit.takes == taken and "forward" in limit.why
    cases = default_sweep(op, narrowing=narrowing)
    read = (lambda c: c.normalized_dims) if factor == "normalized_dims" else (lambda c: len(c.shape))
    assert {read(c) for c in cases} == set(taken) and len(cases) > 50


# -- a layer in place: x handed over as a network hands it (issue 62) -----------------------------------------------
IN_PLACE = [Case("layernorm", (6, 5, 16), dtype, x_format=fmt, normalized_dims=1, order=order, **more)
            for fmt, dtype, order, more in [("sliced", "f64", 1, {}), ("pitched", "f32", 1, {}),
                                            ("strided", "f64", 2, {}), ("contiguous", "f64", "fwd-rev", {}),
                                            ("transposed", "f32", 1, {"frozen": "x"})]]


@pytest.mark.parametrize("case", IN_PLACE, ids=lambda case: case.label)
def test_a_layer_in_place_passes_and_leaves_the_cases_inputs_as_they_were(case):
    """A layer that overwrites x with y and returns it (InPlaceABN's way) failed every row, its write named (or torch's
    'a leaf Variable that requires grad has been used in an in-place operation'): x now reaches it as a network hands
    it, in the case's layout and memory of its own, and its gradients are x's, at order 2 and in forward mode too. Run
    here, on the very arrays normcheck judges with (the cached inputs every later run, rerun and hint reads)."""
    from normcheck.engine.compare import case_inputs

    inputs = case_inputs(case)
    before = inputs.copied()
    report = judge(case, resolve_impl("layernorm", f"{LAYERS}:InPlaceLayerNorm", backend="in-process", hints=False))
    assert report.verdict in OK, report.summary()
    assert all(np.array_equal(getattr(before, k), getattr(inputs, k)) for k in ("x", "dy", "weight", "bias", "ddx"))


def test_a_layer_that_writes_x_and_returns_y_elsewhere_is_named():
    """The same writes, y returned in memory of its own: its caller's x changed for nothing it returns."""
    report = judged("layernorm", "CopyReturningInPlaceLayerNorm", IN_PLACE[1])
    assert report.verdict == FAIL, report.summary()
    assert report.message.startswith("writes its input x in place (sub_ at _layer_classes.py:"), report.message


@pytest.mark.parametrize("fmt", ["sliced", "pitched", "strided", "offset8", "transposed"])
def test_x_is_handed_over_in_its_own_memory_and_the_cases_layout(fmt):
    from normcheck.frameworks.torch import torch_inputs
    from normcheck.frameworks.torch.adapter import handed

    t = torch_inputs(Case("layernorm", (6, 5, 16), "f32", x_format=fmt, normalized_dims=1).make_inputs())
    x = handed(replace(t, x=t.x.requires_grad_())).x
    assert not x.is_leaf and x.untyped_storage().data_ptr() != t.x.untyped_storage().data_ptr()
    assert (x.shape, x.stride(), x.storage_offset()) == (t.x.shape, t.x.stride(), t.x.storage_offset())
    assert x.untyped_storage().nbytes() == t.x.untyped_storage().nbytes() and bool((x == t.x).all())

@pytest.mark.parametrize("shape", [(4, 3, 5), (2, 3, 4, 4, 2), (2, 3, 4, 5)])
def test_what_a_forwards_module_level_helpers_write_is_the_layers(shape):
    """timm's RmsNorm2d calls rms_norm2d (or fast_rms_norm2d, which calls it): mean(dim=1) and weight.reshape(1, -1,
    1, 1) written there, not in forward (3-D and 5-D rows FAILed: 'y has shape ...'); they SKIP naming the code, and
    4-D ones are judged, channels-first."""
    report = judged("rmsnorm", "HelperRmsNorm2d", Case("rmsnorm", shape, "f32", normalized_at="channels"))
    if len(shape) == 4:
        assert report.verdict in OK, report.summary()
    else:
        assert report.verdict == SKIP and ("forward is written for its input's rank (reshape(1, -1, 1, 1) in "
                                           f"rms_norm2d): it takes 4-D input, the case's is {len(shape)}-D"
                                           ) in report.message, report.summary()


def test_a_helper_given_its_dims_or_helpers_that_disagree_read_nothing():
    """A helper that takes the dim it reduces over writes no dim of the layer's; a fast path written for 4-D input
    and a fallback for 3-D leave the rank unread (which runs is not in the source); the helpers two calls deep are
    read (forward -> fast_rms_norm2d -> rms_norm2d)."""
    from normcheck.frameworks.torch.layer_source import reduced_dims, written_ranks
    from normcheck.frameworks.torch.layers import RANKS
    from tests import _layer_classes as L
    assert reduced_dims(L.HelperRmsNorm2d.forward) == (1, "mean(1) in rms_norm2d")
    assert written_ranks(L.HelperRmsNorm2d.forward, RANKS) == ((4,), "reshape(1, -1, 1, 1) in rms_norm2d")
    assert reduced_dims(L.GenericHelperRMSNorm.forward) is None
    assert written_ranks(L.GenericHelperRMSNorm.forward, RANKS) is None
    assert written_ranks(L.DisagreeingHelpersRmsNorm2d.forward, RANKS) is None
