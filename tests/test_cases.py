"""Cases make deterministic, correctly quantised and laid-out inputs; bad cases are rejected."""
import numpy as np
import pytest
import torch

from normcheck.frameworks.torch import torch_inputs
from normcheck import Case, UsageError
from normcheck.cases.case import takers_of
from normcheck.core.text import listing
from normcheck.frameworks.torch import TORCH_DTYPES
from normcheck.numerics.dtypes import parse_dtype, quantise
from normcheck.frameworks.torch import describe_layout as describe
from normcheck.frameworks.torch.tensors import to_device
from normcheck.numerics.formats import base_format, effective_format


def test_same_case_same_bits_different_seed_different_bits():
    a = Case("batchnorm", (2, 3, 4, 4), "bf16", seed=7).make_inputs()
    b = Case("batchnorm", (2, 3, 4, 4), "bf16", seed=7).make_inputs()
    c = Case("batchnorm", (2, 3, 4, 4), "bf16", seed=8).make_inputs()
    assert np.array_equal(a.x, b.x) and np.array_equal(a.dy, b.dy)
    assert not np.array_equal(a.x, c.x)


@pytest.mark.parametrize("dtype", ["f64", "f32", "f16", "bf16", "mixed-f16", "mixed-bf16"])
def test_master_copies_are_exactly_representable_in_the_case_dtypes(dtype):
    spec = parse_dtype(dtype)
    inputs = Case("groupnorm", (2, 4, 3, 3), spec.dtype, spec.param_dtype, groups=2, profile="offset").make_inputs()
    t = torch_inputs(inputs)
    assert t.x.dtype == TORCH_DTYPES[spec.dtype] and t.weight.dtype == TORCH_DTYPES[spec.param_dtype]
    # The reference sees exactly what the implementation sees.
    assert np.array_equal(t.x.double().numpy(), inputs.x)
    assert np.array_equal(t.weight.double().numpy(), inputs.weight)
    assert np.array_equal(quantise(inputs.x, spec.dtype), inputs.x)


@pytest.mark.parametrize("fmt, shape", [("contiguous", (2, 3, 4, 5)), ("channels_last", (2, 3, 4, 5)),
                                        ("channels_last_3d", (2, 3, 2, 4, 5)), ("strided", (2, 3, 4, 5)),
                                        ("strided", (6, 3))])
def test_layouts_are_really_applied_and_values_kept(fmt, shape):
    inputs = Case("batchnorm", shape, "f32", x_format=fmt).make_inputs()
    x = torch_inputs(inputs).x
    assert describe(x) == fmt if fmt != "strided" else not x.is_contiguous()
    if fmt == "strided":
        assert not x.is_contiguous(memory_format=torch.channels_last) or x.dim() != 4
    assert np.array_equal(x.numpy(), inputs.x)


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5), (2, 3, 4, 5)])
def test_transposed_sliced_and_expanded_layouts_are_what_they_say(shape):
    t = torch_inputs(Case("batchnorm", shape, x_format="transposed", dy_format="expanded").make_inputs())
    assert not t.x.is_contiguous() and t.x.transpose(-1, -2).is_contiguous()  # dense, last two dims swapped
    assert t.dy.stride(0) == 0 and t.dy.shape == t.x.shape  # one sample's dy for the whole batch
    inputs = Case("batchnorm", shape, x_format="sliced", dy_format="transposed").make_inputs()
    x = torch_inputs(inputs).x
    assert x.is_contiguous() and x.storage_offset() > 0 and describe(x).startswith("contiguous at storage offset")
    assert np.array_equal(x.numpy(), inputs.x)


@pytest.mark.parametrize("dtype", ["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt, misalignment", [("offset8", 8), ("offset4", 4), ("sliced", None)])
def test_offset_layouts_leave_the_data_pointer_in_their_alignment_class(dtype, fmt, misalignment):
    """A pointer `misalignment` bytes past a 16-byte boundary (the element size where that is finer than an element;
    sliced: an odd number of elements in), contiguous strides, the values kept, for x and dy alike."""
    inputs = Case("layernorm", (3, 10), dtype, x_format=fmt, dy_format=fmt).make_inputs()
    t = torch_inputs(inputs)
    for tensor in (t.x, t.dy):
        size = tensor.element_size()
        expected = max(misalignment, size) if misalignment else (3 * size) % 16
        assert tensor.is_contiguous() and tensor.storage_offset() > 0
        assert tensor.data_ptr() % 16 == expected and tensor.untyped_storage().data_ptr() % 16 == 0
    assert np.array_equal(t.x.double().numpy(), inputs.x)


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5), (2, 3, 4, 5), (3, 1)])
def test_pitched_rows_are_unit_stride_rows_three_lengths_apart(shape):
    inputs = Case("layernorm", shape, "f32", x_format="pitched", dy_format="pitched").make_inputs()
    t = torch_inputs(inputs)
    for tensor in (t.x, t.dy):
        assert not tensor.is_contiguous() and tensor.stride(-1) == 1 and tensor.stride(-2) == 3 * shape[-1]
        assert tensor.storage_offset() == 0
    assert np.array_equal(t.x.numpy(), inputs.x) and np.array_equal(t.dy.numpy(), inputs.dy)


@pytest.mark.parametrize("fmt, shape, strides", [
    ("channels_last_size1", (1, 8, 1, 3), (1, 1, 1, 8)),    # canonical (24, 1, 24, 8): a batch of one, one row
    ("channels_last_size1", (2, 3, 4, 1), (12, 1, 3, 1)),   # canonical (12, 1, 3, 3): a spatial size of 1
    ("channels_last_size1", (2, 1, 3, 3), (9, 2, 3, 1)),    # one channel, canonical stride 1: 2
    ("contiguous_size1", (1, 8, 1, 3), (1, 3, 1, 1)),       # canonical (24, 3, 3, 1)
    ("contiguous_size1", (5, 1), (1, 2)),                   # a hidden size of 1
    ("contiguous_size1", (1, 1, 7), (1, 1, 1)),             # a single row of one sample
    ("contiguous_size1", (2, 3, 4), (12, 4, 1)),            # no size-1 dim: the base layout exactly
])
def test_size1_layouts_give_size1_dims_non_canonical_strides_and_keep_values(fmt, shape, strides):
    """The size-1 formats are built exactly (strides read back), over fresh storage, and keep them on another device
    (`to_device`: the meta device takes the path a GPU's copy takes)."""
    inputs = Case("batchnorm", shape, "f32", x_format=fmt, dy_format=fmt).make_inputs()
    t = torch_inputs(inputs)
    for a, tensor in ((inputs.x, t.x), (inputs.dy, t.dy)):
        assert tensor.stride() == strides and tensor.storage_offset() == 0
        assert np.array_equal(tensor.numpy(), a)
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()  # dense, its own
    assert t.x.untyped_storage().data_ptr() != t.dy.untyped_storage().data_ptr()
    assert to_device(t.x, torch.device("meta")).stride() == strides
    base = "channels_last" if fmt.startswith("channels_last") else "contiguous"
    if 1 in shape and shape[1] > 1:  # torch reads no stride of a size-1 dim: the base format, and says so
        assert t.x.is_contiguous(memory_format=getattr(torch, base if base != "contiguous" else "contiguous_format"))
        assert describe(t.x) == f"{base} with size-1 dims at non-canonical strides (strides {strides})"
    elif 1 not in shape:
        assert describe(t.x) == base


def test_the_size1_formats_are_their_base_where_a_shape_has_no_size1_dim():
    assert effective_format("channels_last_size1", (2, 3, 4, 5)) == "channels_last"
    assert base_format("channels_last_size1") == "channels_last"
    assert effective_format("channels_last_size1", (1, 3, 4, 5)) == "channels_last_size1"
    assert effective_format("strided", (1, 3)) == "strided" == base_format("strided")
    with pytest.raises(UsageError, match="channels_last_size1 needs a 4-D input"):
        Case("batchnorm", (1, 3, 5), x_format="channels_last_size1")


def test_expanded_is_a_layout_of_dy_only():
    with pytest.raises(UsageError, match="memory format expanded applies to dy only"):
        Case("batchnorm", (4, 3), x_format="expanded", dy_format="contiguous")


def test_x_and_dy_can_have_different_layouts():
    t = torch_inputs(Case("batchnorm", (2, 3, 4, 5), x_format="channels_last", dy_format="contiguous").make_inputs())
    assert describe(t.x) == "channels_last" and describe(t.dy) == "contiguous"


def test_torch_inputs_are_fresh_storage_every_time():
    inputs = Case("batchnorm", (2, 3, 4)).make_inputs()
    a, b = torch_inputs(inputs), torch_inputs(inputs)
    a.x.add_(1)
    assert not torch.equal(a.x, b.x)
    assert np.array_equal(b.x.numpy(), inputs.x)


def test_gamma_not_ones_and_beta_not_zeros():
    inputs = Case("batchnorm", (4, 8, 3)).make_inputs()
    assert not np.allclose(inputs.weight, 1) and (inputs.weight < 0).any() and (inputs.weight > 0).any()
    assert not np.allclose(inputs.bias, 0)


def test_no_affine_has_no_parameters():
    inputs = Case("groupnorm", (2, 4, 3), groups=2, affine=False).make_inputs()
    assert inputs.weight is None and inputs.bias is None
    assert torch_inputs(inputs).weight is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(op="groupnorm", shape=(2, 6, 4), groups=4), "not divisible by groups"),
    (dict(op="groupnorm", shape=(2, 6, 4)), "needs --groups"),
    (dict(op="batchnorm", shape=(2, 6, 4), groups=2), f"{listing(takers_of('groups'))} only"),
    (dict(op="batchnorm", shape=(2, 6, 4), dtype="f8"), "unknown dtype"),
    (dict(op="batchnorm", shape=(2, 6, 4), x_format="nhwc"), "unknown memory format"),
    (dict(op="batchnorm", shape=(2, 6, 4), x_format="channels_last"), "needs a 4-D input"),
    (dict(op="batchnorm", shape=(2, 6, 4, 4), dy_format="channels_last_3d"), "needs a 5-D input"),
    (dict(op="batchnorm", shape=(6,)), r"must be \(N, C\)"),
    (dict(op="batchnorm", shape=(1, 3)), "values per channel"),
    (dict(op="groupnorm", shape=(1, 3), groups=3), "values per group"),
    (dict(op="batchnorm", shape=(2, 3, 4), profile="gaussian"), "unknown profile"),
    (dict(op="batchnorm", shape=(2, 3, 4), eps=-1.0), "eps must be"),
    (dict(op="batchnorm", shape=(2, 3, 4), dtype="f64", param_dtype="f32"), "mixed precision"),
    (dict(op="syncbn", shape=(4, 3, 4), split=(1, 2)), "sums to 3"),
    (dict(op="batchnorm", shape=(4, 3, 4), split=(1, 3)), "a split applies to syncbn, syncbn_silu, layernorm_sp, rmsnorm_sp, layernorm_hp, rmsnorm_hp, add_layernorm_sp and add_rmsnorm_sp only"),
    (dict(op="rmsnorm2", shape=(4, 3, 4)), "unknown op"),
])
def test_bad_cases_are_one_line_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message) as info:
        Case(**kwargs)
    assert "\n" not in str(info.value)
