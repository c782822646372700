"""Replay lines: the one command that re-runs exactly one case (the case travels as a --case token)."""
from __future__ import annotations

import shlex

from ..cases.tokens import encode_case
from ..engine import Report


def replay_command(op: str, impl: str, case, backend: str | None = None) -> str:
    """The command line that re-runs exactly this case with this implementation (and world)."""
    parts = ["normcheck compare", f"--op {op}", f"--impl {shlex.quote(impl)}", f"--case {encode_case(case)}"]
    if backend is not None:
        parts.append(f"--backend {backend}")
    return " ".join(parts)


def report_replay(r: Report, backend: str | None = None) -> str:
    return replay_command(r.op, r.impl, r.case, backend)
