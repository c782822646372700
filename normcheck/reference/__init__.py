"""Float64 NumPy reference implementations of the normalisation ops (no torch import).

Every function accepts arrays of any float dtype and any strides, computes in float64 and
never modifies its inputs.  See the module docstrings for the math.
"""

from ._moments import NormBackward
from .batchnorm import BatchNormForward, batch_norm_backward, batch_norm_forward
from .groupnorm import GroupNormForward, group_norm_backward, group_norm_forward
from .instancenorm import InstanceNormForward, instance_norm_backward, instance_norm_forward
from .layernorm import LayerNormForward, layer_norm_backward, layer_norm_forward
from .rmsnorm import RMSNormForward, rms_norm_backward, rms_norm_forward
from .silu_bn import SILU, Epilogue, silu_bn_backward, silu_bn_forward, silu_grad

__all__ = [
    "BatchNormForward",
    "Epilogue",
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
    "silu_bn_backward",
    "silu_bn_forward",
    "silu_grad",
]
