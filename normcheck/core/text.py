"""One-line texts for exceptions and rank lists: every report row and failure message uses these."""
from __future__ import annotations

import os
import sys
import sysconfig
import traceback

MAX_LINE = 300
_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # normcheck/
_OURS_UNDER_TEST = os.path.join(_HARNESS, "kernels") + os.sep                   # code under test, though ours
_LIBRARIES = ("torch", "numpy", "jax", "tensorflow", "keras", "triton")  # (a row names the kernel's caller)


def clip(text: str, limit: int = MAX_LINE) -> str:
    """`text` cut to at most `limit` characters at a word boundary, '...' marking the cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "..."


def first_line(e: BaseException, limit: int = MAX_LINE) -> str:
    """The first non-empty line of an exception's message, clipped to `limit` characters."""
    lines = str(e).strip().splitlines()
    return clip(lines[0].strip() if lines else "", limit)


def exception_text(e: BaseException) -> str:
    """'raised ValueError: bad shape' (or just 'raised ValueError' when there is no message)."""
    first = first_line(e)
    return f"raised {type(e).__name__}: {first}" if first else f"raised {type(e).__name__}"


def _library_dirs() -> list[str]:
    dirs = [sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")]
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(module.__file__)) + os.sep)
    return dirs


def raised_at(e: BaseException) -> str:
    """' (at mykernel.py:12 in forward)': the innermost frame of the code under test that the exception
    passed through (not normcheck's harness, a framework or the standard library), or ''."""
    where = code_at(reversed(traceback.extract_tb(e.__traceback__)))
    return f" (at {where})" if where else ""


def called_at() -> str:
    """'mykernel.py:12 in forward': the innermost frame of the code under test on the current stack (the call
    a hook of normcheck's is handling), or ''."""
    return code_at(reversed(traceback.extract_stack()))


def code_at(frames) -> str:
    """'file.py:line in function' of the first of `frames` (innermost first) in the code under test, or ''."""
    skip = _library_dirs()
    for frame in frames:
        path = os.path.abspath(frame.filename)
        harness = path.startswith(_HARNESS) and not path.startswith(_OURS_UNDER_TEST)
        if not harness and not any(path.startswith(d) for d in skip):
            return f"{os.path.basename(path)}:{frame.lineno} in {frame.name}"
    return ""


def rank_list(ranks) -> str:
    """'rank 2' or 'ranks 0, 3'."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def listing(names) -> str:
    """'a', 'a and b', 'a, b and c'."""
    names = list(names)
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]
