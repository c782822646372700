"""What normcheck keeps on disk between runs: `$NORMCHECK_CACHE`, or `~/.cache/normcheck`.

The compiled kernels (kernels/groupnorm, kernels/syncbn/cuda) live in folders of their own under it; small results
that are costly to compute and determined by their inputs (a sweep's covering array, cases.covering) are JSON
files named by a digest of everything they depend on. A file that cannot be read or written is as if absent: the
value is computed again, so the cache can never change a result, only skip recomputing one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    return Path(os.environ.get("NORMCHECK_CACHE", Path.home() / ".cache" / "normcheck"))


def digest(value: Any) -> str:
    """A stable name for a JSON-able value (its canonical text's sha256)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_json(folder: str, key: str) -> Any | None:
    """The value stored under `key` in `folder`, or None (absent, unreadable, or not JSON)."""
    try:
        return json.loads((cache_root() / folder / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def store_json(folder: str, key: str, value: Any) -> None:
    """Store `value` under `key`: written to a temporary file and renamed, so that a reader (another process) sees
    the whole file or none. Nothing happens where the cache cannot be written."""
    path = cache_root() / folder / f"{key}.json"
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
