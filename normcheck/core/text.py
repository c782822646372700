"""One-line texts for exceptions and rank lists: every report row and failure message uses these."""
from __future__ import annotations

MAX_LINE = 300


def first_line(e: BaseException, limit: int = MAX_LINE) -> str:
    """The first non-empty line of an exception's message, trimmed to `limit` characters."""
    lines = str(e).strip().splitlines()
    first = lines[0].strip() if lines else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def exception_text(e: BaseException) -> str:
    """'raised ValueError: bad shape' (or just 'raised ValueError' when there is no message)."""
    first = first_line(e)
    return f"raised {type(e).__name__}: {first}" if first else f"raised {type(e).__name__}"


def rank_list(ranks) -> str:
    """'rank 2' or 'ranks 0, 3'."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
