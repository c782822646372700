"""The NumPy adapter: for implementations written in NumPy that return every output themselves
(normcheck's same-precision baseline). Inputs are copies of the case's float64 master copies."""
from __future__ import annotations

import numpy as np

from ..core.errors import ImplError


def run(op, bound, case, inputs) -> tuple[dict[str, np.ndarray], str, frozenset[str]]:
    outputs = bound.impl.callable()(case, inputs.copied())
    out = {}
    for name, value in outputs.items():
        if value is None or name not in op.outputs_of(case):
            continue
        shape = op.output_shape(case, name, case.shape)
        if np.shape(value) != tuple(shape):
            raise ImplError(f"{name} has shape {np.shape(value)}, expected {tuple(shape)}")
        out[name] = np.asarray(value, dtype=np.float64)
    return out, bound.impl.reported_path(case), frozenset()


def run_rank(op, fn, case, inputs, rank, group, world_size, device=None):
    raise ImplError("NumPy implementations run in one process only")
