"""What the array frameworks' adapters (JAX, TensorFlow) share: a case's inputs as NumPy arrays in the case's
dtypes and the layer's axis order, the op's array contract, and outputs checked and brought back to the case's
axis order as float64. Framework-free: the adapters turn these arrays into their own.

Arrays have no strides, so the only layout they express is the axis order: the standard layout (channels
at axis 1), and channels last (NHWC) for an op with a channel axis (Op.channels). Strided, transposed,
sliced and expanded formats, and x and dy in different formats, cannot be said in an array: such a case
is a SKIP row saying so, and these implementations' sweeps take the standard layout instead
(Impl.formats, `formats_of`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..core.errors import ImplError
from ..numerics.dtypes import DTYPES

# A first-order gradient -> the input it is taken with respect to, and the cotangent it meets at order 2
INPUT_OF = {"dx": "x", "dweight": "weight", "dbias": "bias"}
COTANGENT_OF = {"dx": "ddx", "dweight": "ddweight", "dbias": "ddbias"}
SIMULATED_DEVICES = 8  # the devices an adapter asks its framework for before it starts (the worlds' size limit)
CHANNELS_LAST = ("channels_last", "channels_last_3d")
ARRAY_FORMATS = ("contiguous", *CHANNELS_LAST)  # what an array-framework Impl's `formats` says


def numpy_dtype(name: str):
    """The NumPy dtype of a case dtype name (bf16: ml_dtypes', which JAX and TensorFlow both read)."""
    if name == "bf16":
        import ml_dtypes  # a dependency of jax and of tensorflow

        return np.dtype(ml_dtypes.bfloat16)
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
    named device axis to reduce over; None where the framework's replica context does that)."""
    x: Any
    weight: Any
    bias: Any
    running_mean: Any
    running_var: Any
    channel_axis: int = 1
    mask: Any = None
    axis_name: str | None = None


def master_arrays(inputs, rows: slice | None = None) -> dict[str, np.ndarray | None]:
    """The case's quantised inputs as NumPy arrays in its dtypes and the layer's axis order (x, dy and ddx
    restricted to `rows` first: one device's share)."""
    case = inputs.case
    dt, pdt = numpy_dtype(case.dtype), numpy_dtype(case.param_dtype)

    def data(a):
        if a is None:
            return None
        return np.ascontiguousarray(_ordered(a if rows is None else a[rows], case).astype(dt))

    def param(a):
        return None if a is None else a.astype(pdt)

    return {"x": data(inputs.x), "dy": data(inputs.dy), "ddx": data(inputs.ddx),
            "weight": param(inputs.weight), "bias": param(inputs.bias), "running_mean": param(inputs.running_mean),
            "running_var": param(inputs.running_var), "ddweight": param(inputs.ddweight),
            "ddbias": param(inputs.ddbias)}


def _ordered(a: np.ndarray, case) -> np.ndarray:
    return np.moveaxis(a, 1, -1) if channels_last(case) else a


def forward(op, fn, case, x, weight, bias, running_mean, running_var, mask=None, axis_name=None):
    """y and {running_mean, running_var} of `fn` (framework arrays in, the same out) under the op's array contract,
    y checked for x's shape and the dtype the case declares (Op.output_dtype)."""
    result = op.contract("array")[1](fn, ArrayInputs(x, weight, bias, running_mean, running_var, channel_axis(case),
                                                     mask, axis_name), case)
    y, stats = split_result(op, result)
    check_array("y", y, x.shape, op.output_dtype(case, "y"), partial(op.dtype_note, case, "y"))
    return y, stats


def split_result(op, result):
    """(y, {running_mean, running_var}) from what an array-contract function returned: y alone, or for an op
    with running statistics (y, running_mean, running_var)."""
    if not op.running_stats:
        return result, {}
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        raise ImplError(f"returned {type(result).__name__}, expected (y, running_mean, running_var) "
                        f"(the {op.name} array contract: running statistics are returned, not updated in place)")
    return result[0], {"running_mean": result[1], "running_var": result[2]}


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

