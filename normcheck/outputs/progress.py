"""A progress bar for long runs: on a terminal only, never in CI logs or in JSON mode.

The bar (tqdm, on stderr) appears only once a run has lasted DELAY_S, so short runs never flash
one, and it is removed at the end so the table reads as if it had never been there.
"""
from __future__ import annotations

import os
import sys
from typing import TextIO

from tqdm import tqdm

DELAY_S = 0.5


def wants_progress(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """A bar only for a person watching: stderr is a terminal and CI is not set."""
    stream = stream or sys.stderr
    in_ci = os.environ.get("CI", "").lower() not in ("", "0", "false")
    return not quiet and not in_ci and stream.isatty()


class Progress:
    def __init__(self, total: int | None, desc: str, enabled: bool):  # (None: a count, no bar: a search's cases)
        self._bar = (tqdm(total=total, desc=desc, unit="case", file=sys.stderr, delay=DELAY_S, leave=False,
                          dynamic_ncols=True) if enabled else None)

    def print(self, line: str, out: TextIO) -> None:
        """Print a table row without tearing the bar (tqdm clears and redraws it around the row)."""
        if self._bar is None:
            print(line, file=out, flush=True)
        else:
            self._bar.write(line, file=out)
            out.flush()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
