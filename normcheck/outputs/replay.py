"""Replay lines: the one command that re-runs exactly one case (the case travels as a --case token)."""
from __future__ import annotations

import shlex

from ..cases.tokens import encode_case
from ..engine import Report
from ..worlds import DEFAULT_TIMEOUT


def replay_command(op: str, impl: str, case, backend: str | None = None, timeout: float | None = None,
                   framework: str = "torch", device: str = "cpu", triton_interpret: bool = False) -> str:
    """The command line that re-runs exactly this case with this implementation (a function: under its framework's
    contract), in the same world on the same device (under Triton's interpreter if it ran there) with the same per-case
    timeout (when it is not the default). A distributed world's device comes with its --backend."""
    parts = ["normcheck compare", f"--op {op}", f"--impl {shlex.quote(impl)}", f"--case {encode_case(case)}"]
    if framework != "torch" and ":" in impl:
        parts.append(f"--framework {framework}")
    if backend is not None:
        parts.append(f"--backend {backend}")
    elif device != "cpu":
        parts.append(f"--device {device}")
    if triton_interpret:
        parts.append("--triton-interpret")
    if timeout is not None and timeout != DEFAULT_TIMEOUT:
        parts.append(f"--timeout {timeout:g}")
    return " ".join(parts)


def report_replay(r: Report, backend: str | None = None, timeout: float | None = None, spec: str | None = None) -> str:
    """`spec`: the --impl the run was given (a module:attr whose record names itself otherwise), else the record's name."""
    return replay_command(r.op, spec or r.impl, r.case, backend, timeout, r.framework, r.device, r.triton_interpret)
