"""The `--json` report: one versioned document per run (documented in docs/json-schema.md).

Within a schema_version keys are only ever added, never renamed, removed or retyped. Non-finite
numbers are written as the strings "inf", "-inf" and "nan" so the output is strict JSON.
"""
from __future__ import annotations

import math
from importlib.metadata import PackageNotFoundError, version

import torch

from ..cases import Case
from ..cases.case import FIELD_NAMES
from ..cases.tokens import encode_case
from ..engine import VERDICTS, Report, TensorReport
from ..engine.coverage import JudgedCoverage
from ..engine.report import never_checked
from ..engine.search import Search
from .replay import report_replay

SCHEMA = "normcheck-report"
SCHEMA_VERSION = 1


def run_document(op: str, impl: str, backend: str | None, reports: list[Report], seconds: float,
                 exit_status: int, timeout: float | None = None, time_limit: dict | None = None,
                 stopped: str = "", device: str = "cpu", triton_interpret: bool = False,
                 covered: JudgedCoverage | None = None, narrowed: list[str] = (), hint: str | None = None,
                 search: Search | None = None) -> dict:
    """`covered`: a sweep's coverage as judged (engine.coverage; None: the run named its cases); `narrowed`: what the
    implementation's limits narrowed of the design (outputs.table.narrowed_lines); `hint`: the option that would make
    the rows that raised pass (engine.coverage.narrowing_hint); `search`: a budgeted search's (engine.search), whose
    smallest failing case is `reports`' one."""
    counts = {v.lower(): sum(r.verdict == v for r in reports) for v in VERDICTS}
    pairs = None if covered is None else {"designed": covered.designed, "judged": covered.judged}
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "normcheck_version": _normcheck_version(),
        "torch_version": torch.__version__,
        "op": op,
        "impl": impl,
        "backend": backend,
        "device": device,
        "triton_interpret": triton_interpret,
        "seconds": round(seconds, 3),
        "exit_status": exit_status,
        "summary": {"total": len(reports), **counts,
                    "never_checked": never_checked(reports) + list(covered.never if covered else ()), "pairs": pairs,
                    "hint": hint},
        "narrowed": list(narrowed),
        "time_limit": time_limit,
        "stopped": stopped or None,
        "cases": [case_document(r, backend, timeout) for r in reports],
        "search": None if search is None else search_document(search),
    }


def search_document(run: Search) -> dict:
    return {
        "seed": run.seed,
        "budget_s": run.budget,
        "judged": run.judged,
        "verdicts": {v.lower(): run.verdicts.get(v, 0) for v in VERDICTS},
        "seconds": round(run.searched, 3),
        "first_failure_s": None if run.first_failure is None else round(run.first_failure, 3),
        "first_found": None if run.first_found is None else run.first_found.case.label,
        "shrink_s": None if run.found is None else round(run.shrink_seconds, 3),
        "shrink_cases": run.shrink_cases,
        "shrunk": run.shrunk,
        "elements": None if run.found is None else run.found.case.numel,
        "sites": list(run.sites),
        "note": run.note or None,
    }


def case_document(r: Report, backend: str | None = None, timeout: float | None = None) -> dict:
    worst = r.worst
    return {
        "label": r.case.label,
        "token": encode_case(r.case),
        "replay": report_replay(r, backend, timeout),
        "case": _case_fields(r.case),
        "verdict": r.verdict,
        "message": r.message,
        "summary": r.summary(),
        "seconds": round(r.seconds, 4),
        "time_limit_s": None if r.time_limit is None else round(r.time_limit, 3),
        "path": r.path,
        "worst_tensor": worst.name if worst else None,
        "max_ratio": _number(worst.max_ratio) if worst else None,
        "unit": r.unit,
        "tensors": [_tensor(t) for t in r.tensors],
        "hint": None if r.hint is None else str(r.hint),
        "unjudged": r.unjudged,
    }


def _case_fields(case: Case) -> dict:
    out = {name: getattr(case, name) for name in FIELD_NAMES}
    out["shape"] = list(case.shape)
    out["split"] = None if case.split is None else list(case.split)
    return {k: _number(v) if isinstance(v, float) else v for k, v in out.items()}


def _tensor(t: TensorReport) -> dict:
    return {
        "name": t.name,
        "verdict": t.verdict,
        "max_ratio": _number(t.max_ratio),
        "max_abs_error": _number(t.max_abs_error),
        "worst_index": list(t.worst_index),
        "got": _number(t.got),
        "expected": _number(t.expected),
        "nonfinite_mismatches": t.nonfinite_mismatches,
        "rank": t.rank,
        "unit_ratios": [_number(v) for v in t.unit_ratios],
        "slack": _number(t.slack),
        "all_zero": t.all_zero,
    }


def _number(x: float) -> float | str:
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _normcheck_version() -> str:
    try:
        return version("normcheck")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"
