"""The in-process world: a single-process op's implementation runs here, in this process."""
from __future__ import annotations

from ..frameworks import FRAMEWORKS


def run(impl, case, inputs, timeout: float):
    return FRAMEWORKS[impl.framework].run(case.record, impl, case, inputs)
