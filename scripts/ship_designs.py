"""Write the covering arrays normcheck ships (normcheck/cases/designs): every op's default sweep, alone and under the
conventions each of its records follows, built afresh by covertable. Files no default sweep uses any more are removed.

    python scripts/ship_designs.py

Run it after a change to a sweep's factors, levels or exclusions (tests/meta/test_designs.py fails until then).
"""
from __future__ import annotations

from normcheck.cases import covering
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import narrowed_design, sweep_levels
from normcheck.impls import IMPLS
from normcheck.ops import OPS


def shipped_sweeps() -> list[tuple[str, tuple]]:
    """(op, follows) of every default sweep whose covering array ships."""
    return [(op, follows) for op in OPS
            for follows in dict.fromkeys([(), *(impl.follows for impl in IMPLS.get(op, {}).values())])]


def shipped_designs() -> list[tuple]:
    """(factors, exclusions) of every default sweep whose covering array ships."""
    return [narrowed_design(op, sweep_levels(Narrowing().with_fields(follows))) for op, follows in shipped_sweeps()]


def main() -> None:
    keys = {covering.ship(*design) for design in shipped_designs()}
    stale = [path for path in covering.SHIPPED.glob("*.json") if path.stem not in keys]
    for path in stale:
        path.unlink()
    print(f"{len(keys)} covering arrays in {covering.SHIPPED} ({len(stale)} stale ones removed)")


if __name__ == "__main__":
    main()
