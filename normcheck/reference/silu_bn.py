"""SiLU ∘ BatchNorm: the output of a fused BN + SiLU layer, and its gradients.

With y = BN(x) and z = SiLU(y) = y·σ(y):
    dz/dy = σ(y)·(1 + y·(1 − σ(y)))
so the backward is the BatchNorm backward of dy = dz·σ(y)·(1 + y·(1 − σ(y))).
"""
from __future__ import annotations

import numpy as np

from ._moments import NormBackward
from .batchnorm import BatchNormForward, batch_norm_backward, batch_norm_forward


def sigmoid(y: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * y))  # no overflow for large |y|


def silu_grad(y: np.ndarray) -> np.ndarray:
    s = sigmoid(y)
    return s * (1.0 + y * (1.0 - s))


def silu_bn_forward(x, weight=None, bias=None, running_mean=None, running_var=None, momentum=0.1,
                    eps=1e-5) -> tuple[np.ndarray, BatchNormForward]:
    """(z, the BatchNorm forward it came from)."""
    bn = batch_norm_forward(x, weight, bias, running_mean, running_var, momentum, eps)
    return bn.y * sigmoid(bn.y), bn


def silu_bn_backward(dz, x, weight=None, bias=None, eps=1e-5) -> NormBackward:
    y = batch_norm_forward(x, weight, bias, eps=eps).y
    dy = np.asarray(dz, dtype=np.float64) * silu_grad(y)
    return batch_norm_backward(dy, x, weight, eps, has_bias=bias is not None)
