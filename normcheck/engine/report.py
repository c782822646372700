"""Verdicts and reports: what one comparison found, per tensor and per case (NumPy in, no framework)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cases import Case
from ..ops.core import GRADIENTS, JVPS, SECOND_ORDER_OUTPUTS

PASS, FAIL, MISTRUSTED, SKIP, KNOWN = "PASS", "FAIL", "MISTRUSTED", "SKIP", "KNOWN"
VERDICTS = (PASS, FAIL, KNOWN, SKIP, MISTRUSTED)

_VERDICT_WORDS = {PASS: "passed", FAIL: "failed", KNOWN: "known upstream issues", SKIP: "skipped",
                  MISTRUSTED: "mistrusted"}


def nothing_tested(reports) -> str:
    """Why a run tested nothing (every case skipped, or no case at all), or '' when it tested something."""
    if not reports:
        return "nothing was tested: the run has no case"
    if all(r.verdict == SKIP for r in reports):
        return (f"nothing was tested: all {len(reports)} cases were skipped "
                f"(the first: {reports[0].message.removeprefix('not supported: ')})")
    return ""


GRADIENT_OUTPUTS = tuple(GRADIENTS) + SECOND_ORDER_OUTPUTS + JVPS  # (every derivative a case may compare)


def never_checked(reports) -> list[str]:
    """The gradients compared in the run that no case checked: MISTRUSTED wherever they were compared (a budget
    as large as the tensor itself, or a reference all but zero), so no verdict of the run speaks for them."""
    seen: dict[str, bool] = {}
    for r in reports:
        for t in r.tensors:
            name = t.name.split("[")[0]
            if name in GRADIENT_OUTPUTS:
                seen[name] = seen.get(name, False) or t.verdict != MISTRUSTED
    return [name for name, checked in seen.items() if not checked]


def tested_count(reports) -> int:
    return sum(r.verdict != SKIP for r in reports)


def tally(reports) -> str:
    """'96 passed, 0 failed, 11 known upstream issues, 1 mistrusted': passed and failed always shown."""
    return tally_of({v: sum(r.verdict == v for r in reports) for v in VERDICTS})


def tally_of(counts: dict) -> str:
    """tally's text of {verdict: how many cases} (a search's counts, which keeps no reports)."""
    return ", ".join(f"{counts.get(v, 0)} {_VERDICT_WORDS[v]}" for v in VERDICTS if counts.get(v, 0) or v in (PASS, FAIL))


# Below this fraction of non-zero reference elements a pass proves little (benchdnn's MISTRUSTED).
MIN_NONZERO_FRACTION = 0.01
# A budget that lets an error this large (relative to the tensor's size) through is blind there.
LOOSE_SLACK = 1.0


@dataclass(frozen=True)
class TensorReport:
    name: str
    max_abs_error: float
    max_ratio: float            # max over elements of error / allowed; ≤ 1 passes
    worst_index: tuple[int, ...]
    got: float
    expected: float
    nonfinite_mismatches: int   # elements where exactly one of got/expected is NaN or ±Inf (or they differ)
    verdict: str
    rank: int | None = None     # split cases: the rank holding the worst element of y or dx
    # max ratio per unit of the op (channel or group): see unit_ratios()
    unit_ratios: tuple[float, ...] = ()
    slack: float = 0.0          # the largest error the budget lets through / the tensor's RMS size
    all_zero: bool = False      # got is 0 everywhere while the reference is not: nothing reached it

    def to_dict(self) -> dict:
        return dict(vars(self), worst_index=list(self.worst_index), unit_ratios=list(self.unit_ratios))


@dataclass
class Report:
    op: str
    impl: str
    case: Case
    verdict: str
    tensors: list[TensorReport] = field(default_factory=list)
    message: str = ""          # why a case failed or was skipped when that is not one tensor's fault
    seconds: float = 0.0
    path: str = ""             # which code path the implementation reports it took (if it does)
    traceback: str = ""        # the whole stack, when the implementation raised (here or in its worker)
    time_limit: float | None = None  # the seconds the case was allowed (None: not bound to a limit)
    framework: str = "torch"   # whose contract the implementation follows (a replay line of a JAX function says so)
    device: str = "cpu"        # where the implementation's tensors lived (the run's --device; a replay line says so)
    triton_interpret: bool = False  # its Triton kernels ran in Triton's interpreter (a replay line says so)
    # A FAIL's hint (engine.hints.Hint): the conventions under which the case passes, had the implementation
    # declared them; never a verdict (None: none found, or none searched)
    hint: Any = None
    # A case judged as far as the implementation goes: what it could not judge, and why (an order-2 case of a kernel
    # only once differentiable: its first-order outputs judged, its second-order ones not), and the case whose
    # outputs were judged (None: the case itself)
    unjudged: str = ""
    judged_as: Any = None

    @property
    def judged_case(self) -> Case:
        return self.case if self.judged_as is None else self.judged_as

    @property
    def passed(self) -> bool:
        return self.verdict != FAIL

    @property
    def worst(self) -> TensorReport | None:
        return max(self.tensors, key=lambda t: t.max_ratio, default=None)

    def tensor(self, name: str) -> TensorReport:
        return next(t for t in self.tensors if t.name == name)

    def summary(self) -> str:
        """One line: what went wrong first, else the worst tensor and its budget ratio; what was not judged."""
        text = self._summary() + (f"; not judged: {self.unjudged}" if self.unjudged else "")
        return f"[{self.path}] {text}" if self.path else text

    def _summary(self) -> str:
        if self.message:
            return self.message
        worst = self.worst
        if worst is None:
            return "nothing compared"
        failure = worst_failure(self.tensors)
        if failure:
            return failure
        loose = sorted((t for t in self.tensors if t.slack >= LOOSE_SLACK), key=lambda t: -t.slack)
        blind = ("; budget ≥ the tensor's size, a pass proves little for "
                 + ", ".join(f"{t.name} (×{t.slack:.3g})" for t in loose)) if loose else ""
        return f"worst {worst.name} ratio {worst.max_ratio:.3g}{blind}"

    @property
    def unit(self) -> str:
        """What the per-unit ratios are per: "channel" or "group"."""
        return self.case.record.unit

    def to_dict(self) -> dict:
        return {
            "op": self.op, "impl": self.impl, "case": self.case.label, "verdict": self.verdict,
            "message": self.message, "seconds": round(self.seconds, 4), "path": self.path,
            "tensors": [t.to_dict() for t in self.tensors], "hint": None if self.hint is None else str(self.hint),
            "unjudged": self.unjudged,
        }


def worst_failure(tensors, notes: bool = True) -> str:
    """The worst failing tensor in one clause; `notes`: with what a gradient that is 0 everywhere means."""
    failing = [t for t in tensors if t.verdict == FAIL]
    if not failing:
        return ""
    t = max(failing, key=lambda t: t.max_ratio)
    nan = f", {t.nonfinite_mismatches} NaN/Inf mismatches" if t.nonfinite_mismatches else ""
    error = abs(t.got - t.expected)
    where = f" on rank {t.rank}" if t.rank is not None else ""
    got, expected = _distinct(t.got, t.expected)
    return (f"{t.name}{where}: ratio {t.max_ratio:.3g} at {list(t.worst_index)} "
            f"(got {got}, expected {expected}, error {error:.3g}){nan}{_NOTHING_REACHED.get(t.name, '') * (t.all_zero and notes)}")


# What a gradient that is 0 everywhere (where the reference is not) means
_TWICE = "; if it is not meant to be differentiated twice, mark it @once_differentiable and these rows SKIP"
_NOTHING_REACHED = {
    "d2x": "; d2x is 0 everywhere: no gradient reaches x through the first-order backward, which is not "
           "differentiable through the statistics (a backward that works from saved values)" + _TWICE,
    "d2weight": "; d2weight is 0 everywhere: no gradient reaches γ through the first-order backward (a backward that "
                "treats γ as a constant)" + _TWICE,
    "d2dy": "; d2dy is 0 everywhere: no gradient reaches dy through the first-order backward (a backward computed "
            "outside autograd)" + _TWICE,
    **{name: f"; {name} is 0 everywhere: no gradient reaches {wrt} (an input detached on the way?)"
       for name, wrt in (("dx", "x"), ("dweight", "γ"), ("dbias", "β"))},
    # forward mode: the tangent that came back is 0 where the directional derivative is not
    "jvp_y": "; jvp_y is 0 everywhere: no tangent reaches y (a forward-mode formula that drops its inputs' tangents)",
    # (the torch adapter takes a gradient that carries no tangent as 0: frameworks.torch.adapter.missing_tangent)
    **{name: f"; {name} is 0 everywhere: {grad} carries no tangent (taken as 0) or a zero one: its backward is computed "
             f"outside forward-mode AD's reach (from saved values), or treats x and γ as constants"
             + _TWICE for name, grad in (("jvp_dx", "dx"), ("jvp_dweight", "dγ"))},
}


def _distinct(a: float, b: float) -> tuple[str, str]:
    """a and b with 10 significant digits, or as many more as it takes to tell them apart (up to 17)."""
    for digits in range(10, 18):
        sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if sa != sb or a == b:
            return sa, sb
    return sa, sb


def unit_ratios(ratio: np.ndarray, units: int) -> np.ndarray:
    """The max budget ratio per unit (channel or group), NaN counted as inf.

    The unit axis is dim 1 of (N, C, ...) and (N, G) tensors and dim 0 of per-channel vectors; an
    axis of C channels folds into `units` consecutive blocks (GroupNorm: C/G channels per group).
    """
    r = np.moveaxis(np.atleast_1d(nan_as_inf(ratio)), 1 if ratio.ndim > 1 else 0, 0)
    if r.shape[0] % units:  # not laid out by channel or group: one value for the whole tensor
        return np.full(units, r.max(initial=0.0))
    return r.reshape(units, -1).max(axis=1, initial=0.0)


def nan_as_inf(ratio: np.ndarray) -> np.ndarray:
    """Budget ratios with NaN counted as inf. Ratios are ≥ 0, inf or NaN, so their sum is NaN exactly where one of
    them is: finite ones come back as they are, without a pass to look for NaN."""
    return np.where(np.isnan(ratio), np.inf, ratio) if np.isnan(np.sum(ratio)) else ratio


def tensor_report(name: str, got: np.ndarray, expected: np.ndarray, ratio: np.ndarray, units: int,
                  slack: float = 0.0) -> TensorReport:
    """`slack`: the largest error the budget lets through relative to the tensor's size (tolerance.slack)."""
    ranked = nan_as_inf(ratio)
    by_unit = tuple(float(v) for v in unit_ratios(ranked, units))
    if ratio.size == 0:
        return TensorReport(name, 0.0, 0.0, (), 0.0, 0.0, 0, PASS, unit_ratios=by_unit, slack=slack)
    flat = int(np.argmax(ranked))
    idx = tuple(int(i) for i in np.unravel_index(flat, ratio.shape))
    # (no ratio is inf unless the worst one is: the elements not finite on either side are counted only then)
    nonfinite = 0 if np.isfinite(ranked.flat[flat]) else int(np.count_nonzero(
        np.isinf(ratio) & ~(np.isfinite(got) & np.isfinite(expected))))
    with np.errstate(invalid="ignore", over="ignore"):
        largest = float(np.max(np.abs(got - expected)))  # (NaN where any error is: counted as inf)
    max_ratio = float(ratio.flat[flat])
    verdict = PASS if max_ratio <= 1.0 else FAIL
    # Zero trust: a pass on a reference that is all but zero, or where an error as large as the tensor itself
    # would have passed, did not check the tensor
    if verdict == PASS and (np.count_nonzero(expected) < MIN_NONZERO_FRACTION * expected.size or slack >= LOOSE_SLACK):
        verdict = MISTRUSTED
    return TensorReport(
        name, np.inf if np.isnan(largest) else largest, max_ratio, idx,
        float(got.flat[flat]), float(expected.flat[flat]), nonfinite, verdict, unit_ratios=by_unit, slack=slack,
        all_zero=verdict == FAIL and not np.any(got) and bool(np.any(expected)),
    )


