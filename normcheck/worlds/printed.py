"""What an implementation printed while a case ran in a worker process (its stdout and stderr, which the worker
writes to a file of its own: they never mix with the report or a JSON document), kept per run so that a failing
case's row can show it, as pytest shows a failing test's captured output.

A judge runs a case more than once (the determinism rerun, a check's other batches): `first()` is the case's own
run. Code run in this process (the in-process world) prints to the terminal as it runs, so nothing is kept for it.
"""
from __future__ import annotations

import os

KEPT_BYTES = 16384   # of one rank's output in one run: its first lines are the clue, not the hundredth
SHOWN_LINES = 10     # under a failing row

_runs: list[dict] = []  # since start(): one {rank: text} per case run in a worker (rank None: a single process)


def start() -> None:
    """A new case is about to be judged."""
    _runs.clear()


def offsets(paths: list[str]) -> list[int]:
    """Where each worker's output file ends now (the start of what the next run prints)."""
    return [os.path.getsize(p) if os.path.exists(p) else 0 for p in paths]


def keep(paths: list[str], since: list[int]) -> None:
    """Keep what each worker wrote to its file after `since` (nothing kept when none printed anything)."""
    texts = {}
    for rank, (path, start_at) in enumerate(zip(paths, since)):
        try:
            with open(path, "rb") as f:
                f.seek(start_at)
                data = f.read(KEPT_BYTES + 1)
        except OSError:
            continue
        text = data[:KEPT_BYTES].decode("utf-8", errors="replace")
        if text.strip():
            texts[rank if len(paths) > 1 else None] = text + ("\n[... cut]" if len(data) > KEPT_BYTES else "")
    _runs.append(texts)


def first() -> dict:
    """{rank: text} the judged case's first run printed ({} when it printed nothing or ran in this process)."""
    return _runs[0] if _runs else {}


def shown(texts: dict, lines: int = SHOWN_LINES) -> list[str]:
    """The lines a failing row shows: per rank that printed, a heading and its first `lines` lines, indented."""
    out = []
    for rank, text in sorted(texts.items(), key=lambda item: item[0] or 0):
        all_lines = text.rstrip("\n").splitlines()
        whose = "" if rank is None else f" by rank {rank}"
        more = f" (first {lines} of {len(all_lines)} lines)" if len(all_lines) > lines else ""
        out.append(f"    printed{whose}{more}:")
        out += [f"    | {line}" for line in all_lines[:lines]]
    return out
