"""What the array frameworks' adapters (JAX, TensorFlow) share: a case's inputs as NumPy arrays in the case's
dtypes and the layer's axis order, the op's array contract, and outputs checked and brought back to the case's
axis order as float64. Framework-free: the adapters turn these arrays into their own.

Arrays have no strides, so the only layout they express is the axis order: the standard layout (channels
at axis 1), and channels last (NHWC) for an op with a channel axis (Op.channels). Strided, transposed,
sliced, offset (offset8, offset4), pitched and expanded formats, size-1 dims at non-canonical strides
(contiguous_size1, channels_last_size1), and x
and dy in different formats, cannot be said in an array: such a case
is a SKIP row saying so, and these implementations' sweeps take the standard layout instead
(Impl.formats, `formats_of`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..core.errors import ImplError
from ..numerics.dtypes import DTYPES
from ..numerics.formats import CHANNELS_LAST

# A first-order gradient -> the cotangent it meets at order 2 (the inputs they are taken of: Op.gradients)
COTANGENT_OF = {"dx": "ddx", "dweight": "ddweight", "dbias": "ddbias"}
ROW_ARRAYS = ("x", "dy", "ddx")  # the x-shaped inputs (besides an op's declared ones): split by rows over devices
SIMULATED_DEVICES = 8  # the devices an adapter asks its framework for before it starts (the worlds' size limit)
ARRAY_FORMATS = ("contiguous", *CHANNELS_LAST)  # what an array-framework Impl's `formats` says


_ML_DTYPES = {"bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}  # (fp8: an output's, never a case's)


def numpy_dtype(name: str):
    """The NumPy dtype of a case dtype name (bf16, fp8: ml_dtypes', which JAX and TensorFlow both read)."""
    if name in _ML_DTYPES:
        import ml_dtypes  # a dependency of jax and of tensorflow

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))
    return np.dtype({"f64": np.float64, "f32": np.float32, "f16": np.float16}[name])


def formats_of(op) -> tuple[str, ...]:
    """The memory formats arrays express for `op` (Impl.formats of its array-framework implementations)."""
    return ARRAY_FORMATS if op.channels else ("contiguous",)


def channels_last(case) -> bool:
    return case.x_format in CHANNELS_LAST


def channel_axis(case) -> int:
    """Where the layer finds the channels: last for a channels-last case (NHWC), else axis 1."""
    return len(case.shape) - 1 if channels_last(case) else 1


@dataclass
class ArrayInputs:
    """What an implementation under an op's array contract receives (framework arrays), and the contract's
    keywords that depend on where it runs: `channel_axis` (1, or -1 for NHWC), and for SyncBN on one device
    of a world `mask` (True for the rows it holds; None when it holds exactly its rows) and `axis_name` (the
    named device axis to reduce over; None where the framework's replica context does that); `extra`: the op's
    declared data inputs (Op.operands: add + norm's residual), by name."""
    x: Any
    weight: Any
    bias: Any
    running_mean: Any
    running_var: Any
    channel_axis: int = 1
    mask: Any = None
    axis_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def declared_operands(case):
    """The operands the op declares on `case` (Op.operands_of: its own, and those its extensions add)."""
    return case.record.operands_of(case)


def declared_results(case):
    """The results after y the op declares on `case` (Op.results_of)."""
    return case.record.results_of(case)


def array_names(case) -> tuple[str, ...]:
    """The names master_arrays gives a case's inputs: x, dy, the parameters, running statistics and order-2
    cotangents, and the op's declared operands."""
    return ("x", "dy", "ddx", "weight", "bias", "running_mean", "running_var", "ddweight", "ddbias",
            *(o.name for o in declared_operands(case)))


def data_operands(case) -> tuple[str, ...]:
    """The op's declared data inputs (the operands the implementation is called with; cotangents are not)."""
    return tuple(o.name for o in declared_operands(case) if o.role == "input")


def row_arrays(case) -> tuple[str, ...]:
    """The inputs shaped like x, split by rows over a world's devices: x, dy, ddx and the declared x-shaped ones."""
    return ROW_ARRAYS + tuple(o.name for o in declared_operands(case) if o.shape == "x")


def result_names(case) -> tuple[str, ...]:
    """What a call under the op's array contract returns, by name: y, then its declared results."""
    return ("y",) + tuple(r.name for r in declared_results(case))


def cotangents_of(case, arrays: dict[str, Any]) -> dict[str, Any]:
    """Each differentiable result -> its cotangent among `arrays` (y's is dy; add + norm's h: dh)."""
    return {"y": arrays["dy"], **{r.name: arrays[r.cotangent] for r in declared_results(case) if r.cotangent}}


def master_arrays(inputs, rows: slice | None = None) -> dict[str, np.ndarray | None]:
    """The case's quantised inputs as NumPy arrays in its dtypes and the layer's axis order (x, dy and ddx
    restricted to `rows` first: one device's share), and the op's declared operands by name: the x-shaped ones
    like x, the others as given."""
    case = inputs.case
    op = case.record
    dt, pdt = numpy_dtype(case.dtype), numpy_dtype(case.param_dtype)

    def data(a, dtype=dt):
        if a is None:
            return None
        return np.ascontiguousarray(_ordered(a if rows is None else a[rows], case).astype(dtype))

    def param(a):
        return None if a is None else a.astype(pdt)

    def operand(o):
        dtype = numpy_dtype(op.dtype_of(case, o.dtype))
        return data(inputs.extra[o.name], dtype) if o.shape == "x" else np.ascontiguousarray(
            inputs.extra[o.name].astype(dtype))

    return {"x": data(inputs.x), "dy": data(inputs.dy), "ddx": data(inputs.ddx),
            "weight": param(inputs.weight), "bias": param(inputs.bias), "running_mean": param(inputs.running_mean),
            "running_var": param(inputs.running_var), "ddweight": param(inputs.ddweight),
            "ddbias": param(inputs.ddbias), **{o.name: operand(o) for o in declared_operands(case)}}


def _ordered(a: np.ndarray, case) -> np.ndarray:
    return np.moveaxis(a, 1, -1) if channels_last(case) else a


def forward(op, fn, case, x, weight, bias, running_mean, running_var, mask=None, axis_name=None, extra=None):
    """{y, *results} and {running_mean, running_var} of `fn` (framework arrays in, the same out) under the op's array
    contract, each result checked for its shape (Op.output_shape) and the dtype the case declares (Op.output_dtype);
    `extra`: the op's declared data inputs by name."""
    inputs = ArrayInputs(x, weight, bias, running_mean, running_var, channel_axis(case), mask, axis_name, extra or {})
    results, stats = split_result(case, op.contract("array")[1](fn, inputs, case))
    for name, value in results.items():
        check_array(name, value, op.output_shape(case, name, x.shape), op.output_dtype(case, name),
                    partial(op.dtype_note, case, name))
    return results, stats


def split_result(case, result):
    """({y, *results}, {running_mean, running_var}) from what an array-contract function returned: y alone, or a
    tuple of y, the op's declared results and (an op with running statistics) running_mean, running_var."""
    op = case.record
    names, stats = result_names(case), ("running_mean", "running_var") if op.running_stats else ()
    if len(names + stats) == 1:
        return {"y": result}, {}
    if not (isinstance(result, (tuple, list)) and len(result) == len(names + stats)):
        got = f"{len(result)} values" if isinstance(result, (tuple, list)) else type(result).__name__
        why = ": running statistics are returned, not updated in place" if stats else ""
        raise ImplError(f"returned {got}, expected ({', '.join(names + stats)}) (the {op.name} array contract{why})")
    values = dict(zip(names + stats, result))
    return {n: values[n] for n in names}, {n: values[n] for n in stats}


def check_array(name: str, value, shape: tuple[int, ...], dtype: str | None, note=None) -> None:
    """`value` (anything with .shape and .dtype) has `shape` and the case dtype `dtype` (None: any float); `note(got)`:
    what to add to a wrong dtype's message (Op.dtype_note)."""
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise ImplError(f"{name} is {type(value).__name__}, expected an array")
    if tuple(value.shape) != tuple(shape):
        raise ImplError(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    got = np.dtype(getattr(value.dtype, "as_numpy_dtype", value.dtype))  # (TensorFlow's DType says it so)
    if dtype is not None and got != numpy_dtype(dtype):
        named = next((n for n in DTYPES if numpy_dtype(n) == got), got.name)
        raise ImplError(f"{name} has dtype {got.name}, expected {numpy_dtype(dtype).name}"
                        f"{note(named) if note else ''}")


def to_outputs(op, case, arrays: dict[str, Any], x_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The outputs (framework arrays already as NumPy) checked for shape and dtype, back in the case's axis
    order, as float64."""
    out = {}
    for name, value in arrays.items():
        if value is None:
            continue
        value = np.asarray(value)
        check_array(name, value, op.output_shape(case, name, x_shape), op.output_dtype(case, name),
                    partial(op.dtype_note, case, name))
        value = value.astype(np.float64)
        if channels_last(case) and name in op.x_shaped:
            value = np.moveaxis(value, -1, 1)
        out[name] = np.ascontiguousarray(value)
    return out

