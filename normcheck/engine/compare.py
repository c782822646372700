"""Judge one implementation on one case: every output it produces against the float64 reference.

NumPy in, NumPy out, no framework: the implementation's runner (bound by the catalogue to its
framework adapter and world) returns float64 outputs; names are resolved by the front ends.
"""
from __future__ import annotations

import time
from dataclasses import replace

from ..cases import Case
from ..core.errors import ImplError, UsageError
from ..core.text import exception_text
from ..ops import Impl
from .baseline import baseline_outputs
from .report import FAIL, KNOWN, MISTRUSTED, PASS, SKIP, Report, tensor_report, worst_failure
from .tolerance import CONSTANTS, Constants, budget_ratio, element_bounds


def judge(case: Case, impl: Impl, constants: Constants = CONSTANTS) -> Report:
    """Run a bound `impl` (impl.runner set) on `case` and compare each output with the reference.

    `constants` are the tolerance model's (tolerance.Constants); only calibration changes them.
    """
    if impl.runner is None:
        raise UsageError(f"implementation {impl.name} is not bound to a world: pass it through normcheck.resolve_impl")
    op = case.record
    start = time.perf_counter()
    path = ""

    def report(verdict: str, tensors=(), message: str = "") -> Report:
        known = impl.known_issue(case) if verdict == FAIL else None
        if known is not None:  # still reported with its numbers, attributed to the recorded cause
            verdict = KNOWN
            message = f"known issue {known.key}: " + (message or worst_failure(tensors))
        return Report(op.name, impl.name, case, verdict, list(tensors), message, time.perf_counter() - start, path)

    reason = impl.unsupported(case)
    if reason:
        return report(SKIP, message=f"not supported: {reason}")

    inputs = case.make_inputs()
    try:
        outputs, path = impl.runner(case, inputs)
        for name in op.required:
            if name in ("dweight", "dbias") and not case.affine:
                continue
            if name not in outputs:
                raise ImplError(f"produced no {name}")
    except ImplError as e:
        return report(FAIL, message=str(e))
    except Exception as e:  # the implementation raised: that is a finding, not a crash of ours
        return report(FAIL, message=exception_text(e))

    ref = op.reference(inputs)
    bounds = element_bounds(case, inputs, constants)
    baseline = baseline_outputs(case, inputs) if constants.baseline_factor else {}
    tensors = []
    for name, got in outputs.items():
        base_name = name.split("[")[0]  # "running_mean[rank 2]" is compared like "running_mean"
        if base_name not in ref:
            continue
        ratio = budget_ratio(got, ref[base_name], bounds[base_name], baseline.get(base_name),
                             op.output_dtype(case, base_name), constants)
        tensor = tensor_report(name, got, ref[base_name], ratio, op.units(case))
        if case.split is not None and base_name in ("y", "dx") and tensor.worst_index:
            tensor = replace(tensor, rank=_rank_of_row(case.split, tensor.worst_index[0]))
        tensors.append(tensor)
    verdicts = {t.verdict for t in tensors}
    verdict = FAIL if FAIL in verdicts else MISTRUSTED if MISTRUSTED in verdicts else PASS
    return report(verdict, tensors)


def _rank_of_row(split: tuple[int, ...], row: int) -> int:
    return next(r for r in range(len(split)) if row < sum(split[: r + 1]))
