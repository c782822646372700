"""Float64 NumPy reference implementations of the normalisation ops (no torch import).

Every function accepts arrays of any float dtype and any strides, computes in float64 and
never modifies its inputs.  See the module docstrings for the math.  Inside ``working_precision(np.float32)``
the same functions compute in float32: the same-precision baseline is this math, not a second copy of it.
"""

from ._moments import NormBackward, working, working_precision
from .batchnorm import BatchNormForward, batch_norm_backward, batch_norm_forward
from .groupnorm import GroupNormForward, group_norm_backward, group_norm_forward
from .instancenorm import InstanceNormForward, instance_norm_backward, instance_norm_forward
from .layernorm import LayerNormForward, layer_norm_backward, layer_norm_forward
from .rmsnorm import RMSNormForward, rms_norm_backward, rms_norm_forward
from .scalenorm import ScaleNormForward, scale_norm_backward, scale_norm_forward
from .silu import silu, silu_grad
from .stages import AFTER, BEFORE, ONE_PLUS, PER_CHANNEL, PER_ELEMENT, PER_SAMPLE, SILU, Activation, ElementFunction, Scale, Sum

__all__ = [
    "BatchNormForward",
    "SILU",
    "GroupNormForward",
    "InstanceNormForward",
    "LayerNormForward",
    "NormBackward",
    "RMSNormForward",
    "batch_norm_backward",
    "batch_norm_forward",
    "group_norm_backward",
    "group_norm_forward",
    "instance_norm_backward",
    "instance_norm_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_norm_backward",
    "rms_norm_forward",
    "ScaleNormForward",
    "scale_norm_backward",
    "scale_norm_forward",
    "silu",
    "silu_grad",
    "AFTER",
    "BEFORE",
    "ONE_PLUS",
    "PER_CHANNEL",
    "PER_ELEMENT",
    "PER_SAMPLE",
    "Activation",
    "ElementFunction",
    "Scale",
    "Sum",
    "working",
    "working_precision",
]
