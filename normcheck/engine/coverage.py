"""Coverage as judged: the pairs of levels the design a run asked for covers, against those its judged cases covered.

The covering design promises every pair of levels in some case; a case that was skipped, or judged only as far as the
implementation goes (an order-2 case judged at order 1), keeps that promise only for what was judged. So the levels
of each judged case are read off the case its outputs were judged on (Report.judged_case), never off the plan, and
what no judged case covered is named with why: the limit that narrowed it away (cases.sweep.narrowed_away), the SKIP
rows that carried it, or a run that stopped first.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ops import Op
from ..cases.narrowing import Narrowing
from ..cases.sweep import coverage, default_sweep, factors, narrowed_away
from .report import FAIL, SKIP


@dataclass(frozen=True)
class JudgedCoverage:
    """`designed`: the pairs of levels the design the run asked for covers; `judged`: how many of them a judged case
    covered; `never`: the values, then the pairs of values each judged apart, that no judged case covered, each with
    why ("order=2: narrowed away: ...")."""
    designed: int
    judged: int
    never: tuple[str, ...] = ()

    @property
    def lost(self) -> int:
        return self.designed - self.judged

    def text(self) -> str:
        return f"{self.judged} of {self.designed} pairs judged"


def judged_coverage(op: Op, reports, narrowing: Narrowing) -> JudgedCoverage:
    """What the run's judged reports covered of the design its options ask for (`narrowing`: the run's, with the
    implementation's limits, which are taken away to find the design asked for)."""
    asked = narrowing.unlimited
    design_values, design_pairs = coverage(op, default_sweep(op, narrowing=asked), asked)
    judged = [r.judged_case for r in reports if r.verdict != SKIP]
    values, pairs = coverage(op, judged, asked)
    skipped = [r for r in reports if r.verdict == SKIP or r.unjudged]
    show = {f.name: f.show for f in factors(op)}
    gone = {(name, v): why for name, _, away in narrowed_away(op, narrowing) for v, why in away.items()}

    def why(*named) -> str:
        for name, v in named:
            if (name, v) in gone:
                return f"narrowed away: {gone[name, v]}"
        skip = next((r for r in skipped if all(f.read(r.case) == v for f in factors(op) for name, v in named
                                               if f.name == name)), None)
        if skip is not None and skip.unjudged:
            return f"judged as far as the implementation goes, not at {skip.unjudged}"
        if skip is not None:
            return f"only in skipped cases ({skip.message.removeprefix('not supported: ')})"
        return "no judged case covered it"

    def label(name, v) -> str:
        return f"{name}={show[name](v)}"

    never = [f"{label(name, v)}: {why((name, v))}" for name, counts in design_values.items()
             for v, n in counts.items() if n and not values[name][v]]
    designed = lost = 0
    for (a, b), counts in design_pairs.items():
        for (va, vb), n in counts.items():
            if not n:
                continue
            designed += 1
            if pairs[a, b][va, vb]:
                continue
            lost += 1
            if values[a][va] and values[b][vb]:  # (a pair with a value never judged is named by that value)
                never.append(f"{label(a, va)} × {label(b, vb)}: {why((a, va), (b, vb))}")
    return JudgedCoverage(designed, designed - lost, tuple(never))


# The factors a run's option narrows, in the order a hint tries them: (factor, the option's name, its value's text)
NARROWING_OPTIONS = (
    ("rank", "rank", str),
    ("normalized_dims", "normalized-dims", str),
    ("layout", "memory-format", lambda v: v[0] if v[0] == v[1] else f"{v[0]}:{v[1]}"),
    ("dtype", "dtype", lambda v: v[0] if v[0] == v[1] else f"mixed-{v[0]}"),
    ("mode", "mode", str),
    ("order", "order", str),
    ("profile", "profile", str),
    ("eps", "eps", lambda v: "none" if v is None else f"{v:g}"),
)
RAISED = "raised "  # (core.text.exception_text: how a row that raised begins)


@dataclass(frozen=True)
class NarrowingHint:
    """The option that makes a run pass whose failing rows all raised one exception on levels of one factor whose
    other levels pass: `option` its name ("rank"), `value` its text ("4"), `text` the line that says so."""
    option: str
    value: str
    text: str

    def line(self, prefix: str = "--") -> str:
        return f"{self.text}: {prefix}{self.option} {self.value}"


def narrowing_hint(op: Op, reports) -> NarrowingHint | None:
    """Where the rows that raised one exception (its type: most of the FAIL rows that raised) all sit on levels of one
    factor and every other judged row on its other levels ('every rank 2, 3 and 5 case raised ValueError: expected 4D
    input ...; rank 4 runs'), the option that keeps those other levels; None otherwise. A rank takes several levels;
    another factor's option one."""
    raised = {}
    for r in reports:
        if r.verdict == FAIL and r.message.startswith(RAISED):
            raised.setdefault(r.message.split(":")[0], []).append(r)
    if not raised:
        return None
    failing = max(raised.values(), key=len)
    others = [r for r in reports if r.verdict != SKIP and r not in failing]
    if not others:
        return None
    by_name = {f.name: f for f in factors(op)}
    for name, option, text in NARROWING_OPTIONS:
        f = by_name.get(name)
        if f is None:
            continue
        level = {repr(v): i for i, v in enumerate(f.values)}
        first = sorted(failing, key=lambda r: level.get(repr(f.read(r.judged_case)), len(level)))
        bad = list(dict.fromkeys(f.read(r.judged_case) for r in first))
        good = sorted(dict.fromkeys(f.read(r.judged_case) for r in others), key=lambda v: level.get(repr(v), 0))
        if set(map(repr, bad)) & set(map(repr, good)) or (name != "rank" and len(good) != 1):
            continue
        return NarrowingHint(option, ",".join(text(v) for v in good),
                             f"every {name} {', '.join(f.show(v) for v in bad)} case "
                             f"{first[0].message.split(' (at ')[0]}; {name} {', '.join(f.show(v) for v in good)} "
                             "runs without it")
    return None


def overruled(narrowing: Narrowing) -> list[str]:
    """What the implementation said it takes where the run's own options fixed that field anyway (they win): why a
    run every case of which was skipped could have been judged, one clause each."""
    fixed = narrowing.fixed
    return list(dict.fromkeys(f"{lim.why} (the run fixes {lim.name}={fixed[lim.name]}: without that option the sweep "
                              f"narrows to what it takes)" for lim in narrowing.limits if lim.name in fixed))
