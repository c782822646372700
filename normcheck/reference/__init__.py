"""Float64 NumPy reference implementations of the normalisation ops (no torch import).

Every function accepts arrays of any float dtype and any strides, computes in float64 and
never modifies its inputs.  See the module docstrings for the math.  Inside ``working_precision(np.float32)``
the same functions compute in float32: the same-precision baseline is this math, not a second copy of it.
"""

from ._moments import NormBackward, working, working_precision
from .adaln import ADALN, Modulation
from .batchnorm import BatchNormForward, batch_norm_backward, batch_norm_forward
from .groupnorm import GroupNormForward, group_norm_backward, group_norm_forward
from .instancenorm import InstanceNormForward, instance_norm_backward, instance_norm_forward
from .layernorm import LayerNormForward, layer_norm_backward, layer_norm_forward
from .residual import RESIDUAL_ADD, Prologue, residual_add, residual_backward
from .rmsnorm import RMSNormForward, rms_norm_backward, rms_norm_forward
from .silu_bn import SILU, Epilogue, silu_bn_backward, silu_bn_forward, silu_grad

__all__ = [
    "ADALN",
    "BatchNormForward",
    "Epilogue",
    "SILU",
    "GroupNormForward",
    "InstanceNormForward",
    "LayerNormForward",
    "Modulation",
    "NormBackward",
    "Prologue",
    "RESIDUAL_ADD",
    "RMSNormForward",
    "batch_norm_backward",
    "batch_norm_forward",
    "group_norm_backward",
    "group_norm_forward",
    "instance_norm_backward",
    "instance_norm_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "residual_add",
    "residual_backward",
    "rms_norm_backward",
    "rms_norm_forward",
    "silu_bn_backward",
    "silu_bn_forward",
    "silu_grad",
    "working",
    "working_precision",
]
