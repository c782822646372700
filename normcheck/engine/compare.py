"""Judge one implementation on one case: every output it produces against the float64 reference.

NumPy in, NumPy out, no framework: the implementation's runner (bound by the catalogue to its
framework adapter and world) returns float64 outputs; names are resolved by the front ends.
"""
from __future__ import annotations

import threading
import time
import traceback
from dataclasses import replace

import numpy as np

from ..cases import Case, CaseInputs
from ..cases.case import default_conventions
from ..core.caching import cache_by_bytes
from ..core.errors import CaseTimeout, ImplError, RaisedElsewhere, UsageError, Unsupported
from ..core.text import exception_text, raised_at
from ..numerics.dtypes import quantise
from ..ops import Bound
from ..ops.core import BATCH_INVARIANCE
from . import invariance
from .baseline import baseline_outputs
from .expected import expected_outputs
from .report import FAIL, KNOWN, MISTRUSTED, PASS, SKIP, Report, tensor_report, worst_failure
from .tolerance import CONSTANTS, Constants, Yardstick, allowance, budget_ratio, element_bounds


def judge(case: Case, bound: Bound, constants: Constants = CONSTANTS) -> Report:
    """Run a bound implementation (ops.Bound: its runner set) on `case` and compare each output with the reference.

    `constants` are the tolerance model's (tolerance.Constants); only calibration changes them. A FAIL carries a
    hint (Report.hint) when the bound run's hint search (Bound.hints) finds declarations under which it passes.
    """
    report = _judged(case, bound, constants)
    hint_again(report, bound, constants)
    return report


def hint_again(report: Report, bound: Bound, constants: Constants = CONSTANTS) -> bool:
    """A FAIL row without a hint gets one where the bound run's hint search (Bound.hints) finds it: True when it now
    carries one (Report.hint set). `judge` asks as it judges the row; a run's last pass asks again for the rows judged
    before any row of their kind was explained (ViTDet's rows of one channel, where every declared set is one value,
    come before the first row that tells channels-first sets apart), which then get what explained rows since."""
    if report.verdict != FAIL or report.hint is not None or bound.hints is None or report.case is None:
        return False
    report.hint = bound.hints.hint(report.case, bound, report,
                                   lambda probe, quiet, against=None: _judged(probe, quiet, constants, against))
    return report.hint is not None


def _judged(case: Case, bound: Bound, constants: Constants, against: Case | None = None) -> Report:
    """`against`: the case whose inputs and expectations `case` is judged on (an order-2 case judged at order 1: the same
    x, dy and parameters, and its first-order references and bounds, computed once for both)."""
    if not isinstance(bound, Bound) or bound.runner is None:
        raise UsageError(f"implementation {bound.name} is not bound to a world: pass it through normcheck.resolve_impl")
    op = case.record
    start = time.perf_counter()
    path, ops, stack, time_limit = "", frozenset(), "", None
    ran = True  # (the run returned or raised: not one that hung, which a rerun would repeat)

    def report(verdict: str, tensors=(), message: str = "") -> Report:
        nonlocal ops
        if verdict == FAIL:
            if case.forward_mode and not ops and ran:  # (a forward-mode run watches no kernels: torch's adapter)
                ops = kernels_run(case, bound)
            issues = bound.applicable_issues(case, ops, op.known_issues)
            kernels = kernels_case(case)  # (torch's kernels run in the precision the code declares it computes in)
            if kernels is not None:
                issues += [k for k in bound.applicable_issues(kernels, ops, op.known_issues)
                           if k not in issues and k not in bound.impl.known_issues]
            raw, (verdict, message) = message, attribute(issues, tensors, message)
            own = [k for k in issues if k in bound.impl.known_issues]
            followed = [k for k in issues if k not in own]  # torch's, followed into code that ran its kernels
            if verdict == KNOWN and followed and attribute(own, tensors, raw)[0] != KNOWN:
                verdict, message = reproduced(case, bound, followed, tensors, raw, outputs, constants)
        return Report(op.name, bound.name, case, verdict, list(tensors), message, time.perf_counter() - start, path,
                      stack, time_limit, bound.framework, bound.device, bound.triton_interpret)

    def as_far_as_it_goes(why: str) -> Report:  # (its first order judged, and the row says what was not)
        judged = _judged(case.with_(order=1), bound, constants, against=case)
        return replace(judged, case=case, judged_as=judged.case, seconds=time.perf_counter() - start,
                       unjudged=f"order {case.order} ({why})")

    reason = bound.unsupported(case)
    if reason and case.order != 1 and bound.unsupported(case.with_(order=1)) is None:
        return as_far_as_it_goes(reason)
    if reason:
        return report(SKIP, message=f"not supported: {reason}")

    inputs = case_inputs(against or case)
    if against is not None and bound.limit is not None:  # (its yardstick is the case it is judged against's)
        bound.limit.expect(case, reference_seconds(against))
    time_limit = bound.limit.seconds(case) if bound.limit is not None else None  # before the run adds to it
    outputs = {}
    try:
        # Run twice on identical inputs where it says it is deterministic: outputs that differ bitwise are a finding of
        # their own (judged below)
        outputs, path, ops, differ = bound.runner(case, inputs, runs_per_case(bound))
        for name in (*op.required_of(case), *case.directional):
            if (name in op.gradients and name not in case.grads) or (name in op.saved_stats and not case.training):
                continue
            if name not in outputs:
                raise ImplError(f"produced no {name}")
    except Unsupported as e:  # (declined by the implementation, or NotDifferentiable: before ImplError)
        if case.order != 1 and case.order in e.declines.get("order", ()):  # (declined for its order alone)
            return as_far_as_it_goes(str(e))
        return report(SKIP, message=f"not supported: {str(e) or 'the implementation declined the case'}")
    except ImplError as e:
        ran = not isinstance(e, CaseTimeout)
        stack = getattr(e, "stack", "")  # RaisedElsewhere: an exception in the implementation's worker
        ops = getattr(e, "ops_called", ops)
        time_limit = getattr(e, "seconds", None) or time_limit  # (a timeout: the limit that applied)
        return report(FAIL, message=str(e))
    except UsageError:
        raise  # bad input is never a finding (nor a known issue)
    except Exception as e:  # the implementation raised: that is a finding, not a crash of ours
        stack = "".join(traceback.format_exception(e))
        ops = getattr(e, "ops_called", ops)
        return report(FAIL, message=exception_text(e) + raised_at(e))

    tensors = tensor_reports(against or case, outputs, constants)
    verdicts = {t.verdict for t in tensors}
    verdict = FAIL if FAIL in verdicts else MISTRUSTED if MISTRUSTED in verdicts else PASS
    if differ and verdict != FAIL:
        return report(FAIL, tensors, f"not deterministic: a second run on the same inputs gave other bits for "
                                     f"{', '.join(differ)} (an Impl record may declare deterministic=False)")
    if BATCH_INVARIANCE in bound.impl.checks and verdict != FAIL:
        try:
            found = invariance.check(case, bound, inputs, outputs, reference_seconds(against or case))
        except Exception as e:  # (a larger batch it cannot run is a finding too)
            found = f"not batch invariant: a larger batch raised {exception_text(e)}"
        if found:
            return report(FAIL, tensors, found)
    return report(verdict, tensors)


def kernels_run(case: Case, bound: Bound) -> frozenset[str]:
    """The aten ops `bound` dispatches on `case`, from a run of its first order: a forward-mode run watches none,
    since a dispatch mode changes what torch's forward-AD formulas return (frameworks.torch.adapter.records_ops)."""
    first = case.with_(order=1)
    try:
        return bound.runner(first, case_inputs(first))[2]
    except Exception as e:  # noqa: BLE001 - what it ran before it raised is all there is to learn
        return frozenset(getattr(e, "ops_called", ()))


def tensor_reports(case: Case, outputs: dict, constants: Constants = CONSTANTS) -> list:
    """Every output the reference defines, against it: ratios, worst elements, the budget's slack."""
    op = case.record
    sticks = yardsticks(case, constants)
    tensors = []
    for name, got in outputs.items():
        base_name = name.split("[")[0]  # "running_mean[rank 2]" is compared like "running_mean"
        if base_name not in sticks:
            continue
        stick = sticks[base_name]
        tensor = tensor_report(name, got, stick.ref, stick.ratios(got), op.units(case), stick.slack)
        if case.split is not None and base_name in ("y", "dx") and tensor.worst_index:
            tensor = replace(tensor, rank=op.layout.rank_of(case.split, tensor.worst_index))
        tensors.append(tensor)
    return tensors


# A failure within this factor of torch's own on the same tensor is "comparable": torch's kernel explains it
COMPARABLE = 4.0


def reproduced(case: Case, bound: Bound, followed, tensors, message: str, outputs: dict,
               constants: Constants = CONSTANTS) -> tuple[str, str]:
    """(verdict, message) of a failure that a known issue of torch's kernels would explain, in code that called
    those kernels: KNOWN only when torch's own record, run on the same case, reproduces it — every failing tensor
    within the case's rounding of torch's output, or failing there too by a comparable amount (a raise: torch's
    record raises what the signature names). Each issue that explains it is tried in turn (an issue of the case's
    own precision, one of the precision the code computes in: _torch_runs) until one is reproduced. Otherwise FAIL,
    saying how far it is from torch's output."""
    failure = message or worst_failure(tensors)
    why = []  # (why each run of torch's did not reproduce it: the first is the row's)
    explaining = [k for k in followed if _explained([k], tensors, message)[0]]
    for issue, (theirs, inputs, alike, where) in ((k, run) for k in explaining for run in _torch_runs(case, k)):
        # A channels-first case's sets are the last K dims under torch's conventions: torch's record runs the same
        # sets moved last (as channels-first code built on torch's kernels hands them), its outputs moved back
        theirs, inputs, back = sets_last(case, theirs, inputs)
        # (a failure of values is reproduced by values: the witness's outputs' dtypes are not its to answer for)
        witness = bound.witness(issue, theirs, values_only=not message) if bound.witness is not None else None
        if witness is None:
            why.append(f"{failure} (resembles known issue {issue.key}; no record of torch's that has it takes this case)")
            continue
        not_alike = _not_reproduced(case, theirs, witness, issue, tensors, message, outputs, constants, inputs, back)
        if not_alike is None:
            known = attribute(followed, tensors, message)[1]
            return KNOWN, f"{known} (torch's own `{witness.name}` record fails this case {alike})"
        why.append(f"{failure} (resembles known issue {issue.key}, but torch's own `{witness.name}` record does not "
                   f"reproduce it on this case{where}: {not_alike})")
    return FAIL, why[0]


def _torch_runs(case: Case, issue) -> list[tuple[Case, CaseInputs | None, str, str]]:
    """(the case torch's record runs, its inputs or None for its own, how it then fails, where) in the order tried:
    the case under torch's conventions where the issue applies to it, then, where the code declares it computes in
    another precision than the case's (--compute-dtype f32 on float64 or half input: diffusers' FP32LayerNorm calls
    F.layer_norm on x.float()), the case's inputs rounded as those kernels were handed them, judged as the code is.
    What the code under test declared of its own outputs (--output-dtype promote) says nothing of torch's kernel."""
    runs = [(case.with_(**default_conventions(case.op)), None, "alike", "")] if issue.applies(case) else []
    kernels = kernels_case(case)
    if kernels is not None and issue.applies(kernels):
        runs.append((kernels, kernels_inputs(case, kernels), f"alike in {kernels.dtype}, the precision this code "
                     "computes in", f" in {kernels.dtype}"))
    return runs


def _not_reproduced(case, own: Case, witness: Bound, issue, tensors, message: str, outputs: dict,
                    constants, inputs: CaseInputs | None = None, back=None) -> str | None:
    """None when `witness` (torch's record), run on `own` (the case under its own conventions), fails as the
    implementation did on `case`; else why not, in a clause. `inputs`: what it runs on where they are not `own`'s
    (the case's rounded to the precision the code computes in, kernels_inputs; the case's sets moved last,
    sets_last): its outputs are then judged as the code's are, on `case`, each moved back by `back` first."""
    try:
        theirs = witness.runner(own, case_inputs(own) if inputs is None else inputs)[0]
        if back is not None:
            theirs = {name: back(a) for name, a in theirs.items()}
    except Exception as e:  # noqa: BLE001 - torch's record raising is data here
        raised = str(e) if isinstance(e, RaisedElsewhere) else exception_text(e)  # (its text says 'raised' already)
        if message and issue.signature.explains_message(raised):
            return None
        return f"it {raised}" if not message else f"it {raised}, not what this code raised"
    if message:
        return "it runs the case without raising"
    op = case.record
    ref, bounds, baseline = expectations(case, constants)
    their_ratios = {t.name: t for t in tensor_reports(own if inputs is None else case, theirs, constants)}
    for t in (t for t in tensors if t.verdict == FAIL):
        name = t.name.split("[")[0]
        if name not in theirs:
            return f"it returns no {name}"
        if np.shape(theirs[name]) != np.shape(outputs[t.name]):  # (a convention that moves the sets: channels-first)
            return (f"its {name} has shape {np.shape(theirs[name])} where this code's has "
                    f"{np.shape(outputs[t.name])}: under torch's conventions the case has other sets")
        allowed = allowance(ref[name], bounds[name], baseline.get(name), constants)
        apart = float(np.max(budget_ratio(outputs[t.name], theirs[name], allowed, None, op.output_dtype(case, name),
                                          constants), initial=0.0))
        theirs_t = their_ratios[name]
        if apart <= 1 or (theirs_t.verdict == FAIL and t.max_ratio <= COMPARABLE * theirs_t.max_ratio):
            continue
        return (f"{t.name} is {apart:.3g} budgets from torch's output (torch's own {name}: "
                f"{theirs_t.verdict}, ratio {theirs_t.max_ratio:.3g})")
    return None


def kernels_case(case: Case) -> Case | None:
    """The case as torch's kernels see it in code that declares it computes in another precision than the case's
    (--compute-dtype f32 on float64 or half input: diffusers' FP32LayerNorm calls F.layer_norm on x.float()): the case
    in that precision, parameters included, under torch's conventions (None: the kernels see the case's own dtype). A
    known issue of torch's kernels in that precision may explain what the code returns; torch's record, run on the
    case's inputs so rounded (kernels_inputs), tells whether it does."""
    if case.compute_dtype == "f64" or (case.dtype, case.param_dtype) == (case.compute_dtype,) * 2:
        return None
    return case.with_(**default_conventions(case.op), dtype=case.compute_dtype, param_dtype=case.compute_dtype)


def sets_last(case: Case, theirs: Case, inputs: CaseInputs | None):
    """(the case torch's record runs, its inputs or None for its own, what moves an output back or None) where
    torch's conventions (`theirs`) would normalise other dims than a channels-first case's (normalized_at channels,
    dims 1..K; torch's records normalise the last K): the same sets moved last, in the standard layout, its x-shaped
    inputs moved alike. Unchanged elsewhere."""
    if case.normalized_at != "channels" or theirs.normalized_at == "channels":
        return theirs, inputs, None
    k, rank = case.normalized_dims, len(case.shape)
    first, last = range(1, 1 + k), range(rank - k, rank)

    def moved(a):  # (x-shaped: x, dy, their directions, an x-shaped operand; a parameter has fewer dims)
        return np.moveaxis(a, first, last) if a.ndim == rank else a

    def back(a):
        return np.moveaxis(a, last, first) if isinstance(a, np.ndarray) and a.ndim == rank else a

    own = theirs.with_(shape=moved(np.empty(case.shape, dtype=bool)).shape, x_format="contiguous",
                       dy_format="contiguous")
    return own, (case_inputs(case) if inputs is None else inputs).mapped(moved, case=own), back


def kernels_inputs(case: Case, kernels: Case) -> CaseInputs:
    """`case`'s inputs rounded to the precision of `kernels` (kernels_case): what torch's kernels were handed."""
    return case_inputs(case).mapped(lambda a: quantise(a, kernels.dtype), case=kernels)


# A case's inputs and expectations are kept while their arrays fit in CACHE_BYTES (each): implementations judged one
# after another on the same case (a catalogue's, a calibration's) share them, and so do sweeps that meet the case
# again (each mutant's, from the sweep's first case). The arrays are never handed to an implementation to keep:
# adapters copy them into the framework's tensors (a worker process gets its own copy).
CACHE_BYTES = 256 << 20


@cache_by_bytes(CACHE_BYTES)
def case_inputs(case: Case) -> CaseInputs:
    return case.make_inputs()


@cache_by_bytes(CACHE_BYTES)
def reference(case: Case) -> tuple[dict, float]:
    """(the float64 reference of every output the case asks for, the seconds it took to compute: a time limit's
    yardstick that needs nothing of the implementation, worlds.limits)."""
    inputs = case_inputs(case)
    start = time.perf_counter()
    with np.errstate(all="ignore"):  # (a singular case's reference is inf or NaN, and judged so: no warning)
        outputs = expected_outputs(case, inputs)
    return outputs, time.perf_counter() - start


def reference_seconds(case: Case) -> float:
    return reference(case)[1]


@cache_by_bytes(CACHE_BYTES)
def expectations(case: Case, constants: Constants) -> tuple[dict, dict, dict]:
    """(the float64 reference of every output the case asks for, the tolerance model's element bounds, the
    same-precision baseline's outputs, or {} when the constants give it no weight)."""
    inputs, ref = case_inputs(case), reference(case)[0]
    with np.errstate(all="ignore"):  # (as the reference's)
        baseline = baseline_outputs(case, inputs, ref) if constants.baseline_factor else {}
        bounds = element_bounds(case, inputs, constants)
    return ref, bounds, baseline


@cache_by_bytes(CACHE_BYTES)
def yardsticks(case: Case, constants: Constants) -> dict[str, Yardstick]:
    """{output: its Yardstick}: the reference and the allowance every implementation judged on the case is held to."""
    ref, bounds, baseline = expectations(case, constants)
    op = case.record
    with np.errstate(all="ignore"):
        return {name: Yardstick.of(ref[name], bounds[name], baseline.get(name), op.output_dtype(case, name), constants)
                for name in ref}


def forget_cases() -> None:
    """Drop every case's cached inputs, reference, expectations and yardsticks: the next judging of a case computes
    them afresh, as a new run does (a benchmark's rounds)."""
    for cached in (case_inputs, reference, expectations, yardsticks):
        cached.cache_clear()


def attribute(own, tensors, message: str) -> tuple[str, str]:
    """(verdict, message) of a failure. `own`: the known issues of the code that ran, applying to the case (the
    record's, and those of the torch kernels the run called: an issue of a kernel the implementation never ran
    is never named). KNOWN when they explain it (every failing tensor, or the message it failed with);
    otherwise FAIL, saying which of them it was near."""
    failure = message or worst_failure(tensors)
    keys, unexplained = _explained(own, tensors, message)
    if own and not unexplained:  # (without what a zero gradient would mean in the user's code: it is torch's)
        return KNOWN, f"known issue {', '.join(keys)}: {message or worst_failure(tensors, notes=False)}"
    if own:
        return FAIL, f"{failure} (near known issue {own[0].key}, which does not explain {', '.join(unexplained)})"
    return FAIL, failure


def _explained(issues, tensors, message: str) -> tuple[list[str], list[str]]:
    """(keys of the issues that explain part of the failure, what none of them explains)."""
    failing = [t for t in tensors if t.verdict == FAIL]
    if failing and not message:
        by = {t.name: [k.key for k in issues if k.signature.explains_tensor(t)] for t in failing}
        return list(dict.fromkeys(k for ks in by.values() for k in ks)), [n for n, ks in by.items() if not ks]
    keys = [k.key for k in issues if k.signature.explains_message(message)]
    return keys, [] if keys else ["its message"]


def runs_per_case(bound: Bound) -> int:
    """How many times judge runs a bound implementation on a case that it takes and that does not fail at once:
    twice when its record says it is deterministic (the second run checks that), else once. A world whose other ranks
    run in processes of their own (torchrun's) runs every case as many times."""
    return 2 if bound.impl.deterministic else 1


def ahead(cases, wanted=lambda case: True, constants: Constants = CONSTANTS):
    """Yield `cases` in order, each one's inputs and expectations computed while the case before it ran: in a thread
    of its own, which works while this one waits for an implementation in a worker process (a sweep on two cores
    takes the time of the slower of the two, not of both). `wanted(case)`: whether a case will run at all (one the
    implementation declines needs no reference). A case whose preparation raised is prepared again by its judge, which
    reports what it raises."""
    cases = list(cases)
    preparing = None
    for i, case in enumerate(cases):
        if preparing is not None:
            preparing.join()  # (never the same work in two threads)
        preparing = None
        if i + 1 < len(cases) and wanted(cases[i + 1]):
            preparing = threading.Thread(target=_prepare, args=(cases[i + 1], constants), daemon=True)
            preparing.start()
        yield case


def _prepare(case: Case, constants: Constants) -> None:
    try:
        case_inputs(case)
        yardsticks(case, constants)
    except Exception:  # noqa: BLE001 - its judge computes it again and reports the failure
        pass
