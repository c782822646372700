"""The simulated-device worlds: every device of a world inside one framework program, in a worker process of its
own (as the isolated world runs a single-process implementation): JAX's host platform split into CPU devices
under shard_map, TensorFlow's CPU split into logical devices under MirroredStrategy. The adapter
(frameworks.*.run_devices) returns each device's outputs; they are assembled like any world's ranks, so a
device's rows of y and dx are named by its rank, and a device that raises fails the whole program (the
framework runs the devices as one), named by the adapter where the framework says which.
"""
from __future__ import annotations

from .core import Run, assemble
from .inprocess import run_isolated
from .limits import CaseLimit


def run_devices(bound, case, inputs, limit: CaseLimit, runs: int = 1) -> Run:
    run = run_isolated(bound, case, inputs, limit, runs)
    return run._replace(outputs=assemble(case, run.outputs))
