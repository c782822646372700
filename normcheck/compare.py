"""Run one implementation on one case and compare every output with the float64 reference."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch

from .baseline import run_baseline
from .cases import Case
from .dtypes import TORCH_DTYPES
from .ops import get_op
from .registry import Impl, resolve_impl
from .runners import ImplError, check_tensor
from .tolerance import CONSTANTS, Constants, budget_ratio, element_bounds, output_dtype

PASS, FAIL, MISTRUSTED, SKIP, KNOWN = "PASS", "FAIL", "MISTRUSTED", "SKIP", "KNOWN"
VERDICTS = (PASS, FAIL, KNOWN, SKIP, MISTRUSTED)

_VERDICT_WORDS = {PASS: "passed", FAIL: "failed", KNOWN: "known upstream issues", SKIP: "skipped",
                  MISTRUSTED: "mistrusted"}


def tally(reports) -> str:
    """'96 passed, 0 failed, 11 known upstream issues, 1 mistrusted': passed and failed always shown."""
    counts = {v: sum(r.verdict == v for r in reports) for v in VERDICTS}
    return ", ".join(f"{n} {_VERDICT_WORDS[v]}" for v, n in counts.items() if n or v in (PASS, FAIL))


# Below this fraction of non-zero reference elements a pass proves little (benchdnn's MISTRUSTED).
MIN_NONZERO_FRACTION = 0.01


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
    rank: int | None = None     # SyncBN: the rank holding the worst element of y or dx
    # max ratio per channel (BatchNorm, SyncBN) or group (GroupNorm): see unit_ratios()
    unit_ratios: tuple[float, ...] = ()

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

    @property
    def passed(self) -> bool:
        return self.verdict != FAIL

    @property
    def worst(self) -> TensorReport | None:
        return max(self.tensors, key=lambda t: t.max_ratio, default=None)

    def tensor(self, name: str) -> TensorReport:
        return next(t for t in self.tensors if t.name == name)

    def summary(self) -> str:
        """One line: what went wrong first, else the worst tensor and its budget ratio."""
        text = self._summary()
        return f"[{self.path}] {text}" if self.path else text

    def _summary(self) -> str:
        if self.message:
            return self.message
        worst = self.worst
        if worst is None:
            return "nothing compared"
        return _worst_failure(self.tensors) or f"worst {worst.name} ratio {worst.max_ratio:.3g}"

    def to_dict(self) -> dict:
        return {
            "op": self.op, "impl": self.impl, "case": self.case.label, "verdict": self.verdict,
            "message": self.message, "seconds": round(self.seconds, 4), "path": self.path,
            "tensors": [t.to_dict() for t in self.tensors],
        }


def compare(op: str, impl: str | Impl | Callable | None, case: Case, constants: Constants = CONSTANTS) -> Report:
    """Run `impl` on `case`; compare each output it produces with the float64 reference.

    `constants` are the tolerance model's (tolerance.Constants); only calibration changes them.
    """
    the_op = get_op(op)
    impl = resolve_impl(op, impl)
    start = time.perf_counter()

    path = ""

    def report(verdict: str, tensors=(), message: str = "") -> Report:
        known = impl.known_issue(case) if verdict == FAIL else None
        if known is not None:  # still reported with its numbers, attributed to the recorded cause
            verdict = KNOWN
            message = f"known issue {known.key}: " + (message or _worst_failure(tensors))
        return Report(op, impl.name, case, verdict, list(tensors), message, time.perf_counter() - start, path)

    reason = impl.supports(case)
    if reason:
        return report(SKIP, message=f"not supported: {reason}")

    inputs = case.make_inputs()
    t = inputs.torch_inputs()
    before = t.snapshot()
    try:
        outputs = impl.run(case, t)
        if not isinstance(outputs, dict):
            raise ImplError(f"runner returned {type(outputs).__name__}, expected a dict of outputs")
        path = str(outputs.pop("_path", "") or "")  # an implementation may say which path it took
        outputs = {k: v for k, v in outputs.items() if v is not None}
        for name in the_op.required:
            if name in ("dweight", "dbias") and not case.affine:
                continue
            if name not in outputs:
                raise ImplError(f"produced no {name}")
    except ImplError as e:
        return report(FAIL, message=str(e))
    except Exception as e:  # the implementation raised: that is a finding, not a crash of ours
        return report(FAIL, message=f"raised {type(e).__name__}: {_first_line(e)}")
    modified = t.modified_since(before)
    if modified:
        return report(FAIL, message=f"modified its input {', '.join(modified)} in place")

    ref = the_op.reference(inputs)
    bounds = element_bounds(case, inputs, constants)
    baseline = run_baseline(case, inputs.torch_inputs()) if constants.baseline_factor else {}
    tensors = []
    for name in outputs:
        base_name = name.split("[")[0]  # "running_mean[rank 2]" is compared like "running_mean"
        if base_name not in ref:
            continue
        expected = ref[base_name]
        try:
            got = _as_float64(base_name, outputs[name], case, expected.shape, label=name)
        except ImplError as e:
            return report(FAIL, tensors, str(e))
        base = baseline.get(base_name)
        base = None if base is None else _as_float64(base_name, base, case, expected.shape, check_dtype=False)
        ratio = budget_ratio(got, expected, bounds[base_name], base, output_dtype(case, base_name), constants)
        tensor = _tensor_report(name, got, expected, ratio, ratio_unit(case)[1])
        if case.split is not None and name in ("y", "dx") and tensor.worst_index:
            tensor = replace(tensor, rank=_rank_of_row(case.split, tensor.worst_index[0]))
        tensors.append(tensor)
    verdicts = {t.verdict for t in tensors}
    verdict = FAIL if FAIL in verdicts else MISTRUSTED if MISTRUSTED in verdicts else PASS
    return report(verdict, tensors)


def _rank_of_row(split: tuple[int, ...], row: int) -> int:
    return next(r for r in range(len(split)) if row < sum(split[: r + 1]))


def _worst_failure(tensors) -> str:
    failing = [t for t in tensors if t.verdict == FAIL]
    if not failing:
        return ""
    t = max(failing, key=lambda t: t.max_ratio)
    nan = f", {t.nonfinite_mismatches} NaN/Inf mismatches" if t.nonfinite_mismatches else ""
    error = abs(t.got - t.expected)
    where = f" on rank {t.rank}" if t.rank is not None else ""
    return (f"{t.name}{where}: ratio {t.max_ratio:.3g} at {list(t.worst_index)} "
            f"(got {t.got:.10g}, expected {t.expected:.10g}, error {error:.3g}){nan}")


def _as_float64(name, value, case: Case, shape, check_dtype: bool = True, label: str | None = None) -> np.ndarray:
    # Saved statistics may legitimately come back in another float dtype; everything else must not.
    strict = check_dtype and name not in ("mean", "invstd", "rstd")
    dtype = TORCH_DTYPES[output_dtype(case, name)] if strict else value.dtype
    value = check_tensor(label or name, value, shape, dtype)
    return value.detach().to(torch.float64).contiguous().numpy()


def ratio_unit(case: Case) -> tuple[str, int]:
    """What reports break each tensor's ratios down by: its groups (GroupNorm), else its channels."""
    return ("group", case.groups) if case.groups is not None else ("channel", case.channels)


def unit_ratios(ratio: np.ndarray, units: int) -> np.ndarray:
    """The max budget ratio per unit (channel or group), NaN counted as inf.

    The unit axis is dim 1 of (N, C, ...) and (N, G) tensors and dim 0 of per-channel vectors; an
    axis of C channels folds into `units` consecutive blocks (GroupNorm: C/G channels per group).
    """
    r = np.moveaxis(np.where(np.isnan(ratio), np.inf, ratio), 1 if ratio.ndim > 1 else 0, 0)
    if r.shape[0] % units:  # not laid out by channel or group: one value for the whole tensor
        return np.full(units, r.max(initial=0.0))
    return r.reshape(units, -1).max(axis=1, initial=0.0)


def _tensor_report(name: str, got: np.ndarray, expected: np.ndarray, ratio: np.ndarray, units: int) -> TensorReport:
    nonfinite = int(np.count_nonzero(np.isinf(ratio) & ~(np.isfinite(got) & np.isfinite(expected))))
    by_unit = tuple(float(v) for v in unit_ratios(ratio, units))
    if ratio.size == 0:
        return TensorReport(name, 0.0, 0.0, (), 0.0, 0.0, 0, PASS, unit_ratios=by_unit)
    flat = int(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio)))
    idx = tuple(int(i) for i in np.unravel_index(flat, ratio.shape))
    with np.errstate(invalid="ignore"):
        err = np.abs(got - expected)
    max_ratio = float(ratio.flat[flat])
    verdict = PASS if max_ratio <= 1.0 else FAIL
    if verdict == PASS and np.count_nonzero(expected) < MIN_NONZERO_FRACTION * expected.size:
        verdict = MISTRUSTED
    return TensorReport(
        name, float(np.nanmax(np.where(np.isnan(err), np.inf, err))), max_ratio, idx,
        float(got.flat[flat]), float(expected.flat[flat]), nonfinite, verdict, unit_ratios=by_unit,
    )


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else ""
