"""Keras 3's normalization layers (TensorFlow backend) under the ops' array contracts (ops.*.ARRAY_SIGNATURE):
each function builds the layer as a user configures it for the case (its dtype policy from the input's and the
parameters' dtypes: "mixed_bfloat16" for bf16 input with f32 parameters; momentum in Keras' convention, the
weight of the old value: 1 − torch's) and calls it statelessly (`Layer.stateless_call`) with the case's
parameters and running statistics, which is how gradients reach them as tensors. Loaded by name where the
implementation runs (this module imports Keras); the records live in impls.frameworks.
"""
from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402


def _policy(x, *params) -> str:
    """The Keras dtype policy of a case: the input's dtype, or mixed_<input> when the parameters are float32."""
    compute = x.dtype.name
    variables = next((p.dtype.name for p in params if p is not None), compute)
    return f"mixed_{compute}" if compute in ("float16", "bfloat16") and variables == "float32" else compute


def _call(layer, x, trainable, non_trainable=(), **kwargs):
    layer.build(tuple(x.shape))
    return layer.stateless_call([v for v in trainable if v is not None], list(non_trainable), x, **kwargs)


def batch_norm(x, weight, bias, running_mean, running_var, *, training, momentum, eps, channel_axis, mask=None,
               axis_name=None, synchronized=False):
    """keras.layers.BatchNormalization (synchronized: its statistics all-reduced over the replicas)."""
    layer = keras.layers.BatchNormalization(axis=channel_axis, momentum=1.0 - momentum, epsilon=eps,
                                            center=bias is not None, scale=weight is not None,
                                            synchronized=synchronized, dtype=_policy(x, running_mean))
    y, (mean, var) = _call(layer, x, (weight, bias), (running_mean, running_var), training=training)
    return y, mean, var


def sync_batch_norm(x, weight, bias, running_mean, running_var, *, training, momentum, eps, channel_axis, mask=None,
                    axis_name=None):
    """keras.layers.BatchNormalization(synchronized=True) on one replica of a MirroredStrategy."""
    return batch_norm(x, weight, bias, running_mean, running_var, training=training, momentum=momentum, eps=eps,
                      channel_axis=channel_axis, synchronized=True)


def group_norm(x, weight, bias, *, num_groups, eps, channel_axis):
    """keras.layers.GroupNormalization."""
    layer = keras.layers.GroupNormalization(groups=num_groups, axis=channel_axis, epsilon=eps, center=bias is not None,
                                            scale=weight is not None, dtype=_policy(x, weight, bias))
    y, _ = _call(layer, x, (weight, bias))
    return y


def layer_norm(x, weight, bias, *, axes, eps):
    """keras.layers.LayerNormalization over the last K axes."""
    layer = keras.layers.LayerNormalization(axis=list(axes), epsilon=eps, center=bias is not None,
                                            scale=weight is not None, dtype=_policy(x, weight, bias))
    y, _ = _call(layer, x, (weight, bias))
    return y
