"""SiLU ∘ BatchNorm: the output of a fused BN + SiLU layer, and its gradients.

With y = BN(x) and z = SiLU(y) = y·σ(y):
    dz/dy = σ(y)·(1 + y·(1 − σ(y)))
so the backward is the BatchNorm backward of dy = dz·σ(y)·(1 + y·(1 − σ(y))).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._moments import NormBackward, working
from .batchnorm import BatchNormForward, batch_norm_backward, batch_norm_forward


def sigmoid(y: np.ndarray) -> np.ndarray:
    """σ(y) = 1/(1 + e^−y) to a few ulps everywhere: e^y/(1 + e^y) for y < 0, so nothing overflows,
    and no 1 + tanh(y/2) that cancels for large negative y (a relative error of 1e-8 at y = −20)."""
    e = np.exp(-np.abs(y))
    return np.where(y >= 0, 1 / (1 + e), e / (1 + e))


def silu_grad(y: np.ndarray) -> np.ndarray:
    s = sigmoid(y)
    return s * (1.0 + y * (1.0 - s))


def silu_grad2(y: np.ndarray) -> np.ndarray:
    """d²SiLU/dy² = σ(y)·(1 − σ(y))·(2 + y·(1 − 2σ(y)))."""
    s = sigmoid(y)
    return s * (1 - s) * (2 + y * (1 - 2 * s))


def silu(y: np.ndarray) -> np.ndarray:
    return y * sigmoid(y)


@dataclass(frozen=True)
class Epilogue:
    """An element-wise function a fused layer applies after the normalisation, z = f(y), with its
    first two derivatives (the error model propagates y's error through them). Computes in the
    dtype of its argument."""
    name: str
    f: Callable[[np.ndarray], np.ndarray]
    grad: Callable[[np.ndarray], np.ndarray]
    grad2: Callable[[np.ndarray], np.ndarray]


SILU = Epilogue("silu", silu, silu_grad, silu_grad2)


def silu_bn_forward(x, weight=None, bias=None, running_mean=None, running_var=None, momentum=0.1,
                    eps=1e-5) -> tuple[np.ndarray, BatchNormForward]:
    """(z, the BatchNorm forward it came from)."""
    bn = batch_norm_forward(x, weight, bias, running_mean, running_var, momentum, eps)
    return bn.y * sigmoid(bn.y), bn


def silu_bn_backward(dz, x, weight=None, bias=None, eps=1e-5) -> NormBackward:
    y = batch_norm_forward(x, weight, bias, eps=eps).y
    dy = np.asarray(dz, dtype=working()) * silu_grad(y)
    return batch_norm_backward(dy, x, weight, eps, has_bias=bias is not None)
