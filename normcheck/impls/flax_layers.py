"""flax's normalization layers under the ops' array contracts (ops.*.ARRAY_SIGNATURE): each function builds the
layer as a user configures it for the case (dtype: the input's, so y comes back in it; param_dtype: the
parameters'; momentum in flax's convention, the weight of the old value: 1 − torch's), gives it the case's
parameters and running statistics, and calls it. Loaded by name where the implementation runs (this module
imports flax); the records live in impls.frameworks.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


def _params(**named) -> dict:
    return {k: v for k, v in named.items() if v is not None}


def _param_dtype(x, *params):
    return next((p.dtype for p in params if p is not None), x.dtype)


def batch_norm(x, weight, bias, running_mean, running_var, *, training, momentum, eps, channel_axis, mask=None,
               axis_name=None):
    """flax.linen.BatchNorm (axis_name: synchronised over that device axis, as SyncBN; mask: the rows it holds)."""
    layer = nn.BatchNorm(use_running_average=not training, axis=channel_axis, momentum=1.0 - momentum, epsilon=eps,
                         dtype=x.dtype, param_dtype=running_mean.dtype, use_scale=weight is not None,
                         use_bias=bias is not None, axis_name=axis_name)
    variables = {"params": _params(scale=weight, bias=bias), "batch_stats": {"mean": running_mean, "var": running_var}}
    y, state = layer.apply(variables, x, mask=mask, mutable=["batch_stats"])
    stats = state.get("batch_stats", variables["batch_stats"])
    return y, stats["mean"], stats["var"]


def _channels_last(fn, x, channel_axis):
    """fn on x with its channel axis moved last (flax's GroupNorm takes channels last only), and back."""
    axis = channel_axis % x.ndim
    if axis == x.ndim - 1:
        return fn(x)
    return jnp.moveaxis(fn(jnp.moveaxis(x, axis, -1)), -1, axis)


def group_norm(x, weight, bias, *, num_groups, eps, channel_axis):
    """flax.linen.GroupNorm (channels last: an NCHW input is moved to NHWC and back)."""
    layer = nn.GroupNorm(num_groups=num_groups, epsilon=eps, dtype=x.dtype, param_dtype=_param_dtype(x, weight, bias),
                         use_scale=weight is not None, use_bias=bias is not None)
    return _channels_last(lambda v: layer.apply({"params": _params(scale=weight, bias=bias)}, v), x, channel_axis)


def layer_norm(x, weight, bias, *, axes, eps):
    """flax.linen.LayerNorm over the last K axes (reduction_axes = feature_axes = them)."""
    layer = nn.LayerNorm(epsilon=eps, dtype=x.dtype, param_dtype=_param_dtype(x, weight, bias),
                         use_scale=weight is not None, use_bias=bias is not None, reduction_axes=axes,
                         feature_axes=axes)
    return layer.apply({"params": _params(scale=weight, bias=bias)}, x)


def rms_norm(x, weight, *, axes, eps):
    """flax.linen.RMSNorm over the last K axes."""
    layer = nn.RMSNorm(epsilon=eps, dtype=x.dtype, param_dtype=_param_dtype(x, weight), use_scale=weight is not None,
                       reduction_axes=axes, feature_axes=axes)
    return layer.apply({"params": _params(scale=weight)}, x)


# ----------------------------------------------------------------------------- flax.nnx, where it differs from linen
# nnx's layers have their own statistics and normalisation code: inputs, statistics and parameters are promoted
# to one dtype (promote_dtype) before normalising, where linen keeps the statistics in float32.
def _set(layer, **values) -> None:
    for name, value in values.items():
        if value is not None:
            variable = getattr(layer, name)
            variable[...] = value.reshape(variable[...].shape)  # (nnx keeps multi-axis features flat)


def nnx_batch_norm(x, weight, bias, running_mean, running_var, *, training, momentum, eps, channel_axis, mask=None,
                   axis_name=None):
    """flax.nnx.BatchNorm."""
    layer = nnx.BatchNorm(x.shape[channel_axis], use_running_average=not training, axis=channel_axis,
                          momentum=1.0 - momentum, epsilon=eps, dtype=x.dtype, param_dtype=running_mean.dtype,
                          use_scale=weight is not None, use_bias=bias is not None, axis_name=axis_name,
                          rngs=nnx.Rngs(0))
    _set(layer, scale=weight, bias=bias, mean=running_mean, var=running_var)
    y = layer(x, mask=mask)
    return y, layer.mean[...], layer.var[...]


def nnx_layer_norm(x, weight, bias, *, axes, eps):
    """flax.nnx.LayerNorm over the last K axes."""
    layer = nnx.LayerNorm(math.prod(x.shape[axes[0]:]), epsilon=eps, dtype=x.dtype, param_dtype=_param_dtype(x, weight, bias),
                          use_scale=weight is not None, use_bias=bias is not None, reduction_axes=axes,
                          feature_axes=axes, rngs=nnx.Rngs(0))
    _set(layer, scale=weight, bias=bias)
    return layer(x)


def nnx_group_norm(x, weight, bias, *, num_groups, eps, channel_axis):
    """flax.nnx.GroupNorm (channels last: an NCHW input is moved to NHWC and back)."""
    axis = channel_axis % x.ndim
    layer = nnx.GroupNorm(x.shape[axis], num_groups=num_groups, epsilon=eps, dtype=x.dtype,
                          param_dtype=_param_dtype(x, weight, bias), use_scale=weight is not None,
                          use_bias=bias is not None, rngs=nnx.Rngs(0))
    _set(layer, scale=weight, bias=bias)
    return _channels_last(layer, x, channel_axis)


def nnx_rms_norm(x, weight, *, axes, eps):
    """flax.nnx.RMSNorm over the last K axes."""
    layer = nnx.RMSNorm(math.prod(x.shape[axes[0]:]), epsilon=eps, dtype=x.dtype, param_dtype=_param_dtype(x, weight),
                        use_scale=weight is not None, reduction_axes=axes, feature_axes=axes, rngs=nnx.Rngs(0))
    _set(layer, scale=weight)
    return layer(x)
