"""SiLU(y) = y·σ(y) and its first two derivatives, dSiLU/dy = σ(y)·(1 + y·(1 − σ(y))) and
d²SiLU/dy² = σ(y)·(1 − σ(y))·(2 + y·(1 − 2σ(y))): the activation of fused norms and the gate of gated ones
(reference.stages)."""
from __future__ import annotations

import numpy as np


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
