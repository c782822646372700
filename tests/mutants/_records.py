"""The Impl record of a catalogue implementation that follows a convention (or whose op needs a record)."""
from __future__ import annotations

from normcheck.ops import Impl


def test_code(op: str, name: str, fn, what: str, follows) -> Impl:
    """`fn` as the record named `name` (its qualname too: `--impl module:name` and the replay lines find it by that),
    following the conventions `follows`."""
    fn.__qualname__ = name
    return Impl(name, op, what, fn, follows=follows, capabilities="unknown (test code)")
