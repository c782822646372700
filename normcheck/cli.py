"""`normcheck compare | list`: run a request (normcheck.request) case by case, print one row per case and a summary."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace

from .arguments import parse
from .cases import Case
from .cases.narrowing import Narrowing
from .cases.search_space import search_cases
from .cases.sweep import default_sweep
from .core.disk_cache import cache_root
from .core.errors import ImplError, Unsupported, UsageError
from .doctor import run_doctor
from .engine import FAIL, KNOWN, ahead, hint_again, judge, nothing_tested, runs_per_case
from .engine.coverage import judged_coverage, narrowing_hint, overruled
from .engine.normalises import no_norm
from .engine.other_op import another_op
from .engine.search import database_folder, require_hypothesis, search
from .frameworks.torch.triton import INTERPRETER_ELEMENT_SCALE
from .impls import backend_of, check_world, list_impls, resolve_impl, support_text
from .impls.limits import learned
from .ops import OPS, get_op
from .outputs.coverage import coverage_document, coverage_text
from .outputs.json_report import run_document
from .outputs.progress import Progress, wants_progress
from .outputs.replay import report_replay
from .outputs.sweep_report import Run, RunEnd, SweepReporter
from .outputs.table import narrowed_lines, search_lines, search_summary_line, wants_colour
from .request import Request, compare_request, declared_conventions, options_narrowing
from .worlds import CaseLimit, printed
from .worlds.env import close_env_world



def _cases(request: Request, bound) -> tuple[list[Case], Narrowing | None]:
    """The cases to run: those the request names, or the default sweep narrowed by its case options and by what the
    `bound` implementation cannot do (impls.limits; in the layouts it can express, Impl.formats, and the splits,
    Impl.shares); all in the conventions it follows (Impl.follows) or the run declares. With the narrowing of a sweep
    (None: the cases were named)."""
    if request.named is not None:
        follows = {} if request.token else dict(bound.impl.follows)  # (a token is the whole case)
        return [case.with_(**follows) if follows else case for case in request.named], None
    narrowing = run_narrowing(request, bound)
    return [case for seed in request.seeds
            for case in default_sweep(request.op, seed, formats=bound.impl.formats, shares=bound.impl.shares,
                                      narrowing=narrowing)], narrowing


def run_narrowing(request: Request, bound) -> Narrowing:
    """What the run's options and the implementation fix and take of the design (a sweep's, or a search's): the
    conventions it follows, the element scale Triton's interpreter needs, what it cannot do."""
    narrowing = request.narrowing.with_fields(bound.impl.follows)
    if bound.triton_interpret:
        narrowing = replace(narrowing, element_scale=INTERPRETER_ELEMENT_SCALE)
    return learned(request.op, bound, narrowing)  # (what it cannot do narrows the design as an option does: impls.limits)


def run_compare(request: Request, out) -> int:
    """Run what `request` asks (its cases, or --budget's search) and report each case as it is judged; the exit status:
    0 every case passed, 1 one failed, 2 none was tested, 130/143 interrupted."""
    op, reports_to = request.op, request.reports
    limit = CaseLimit(request.timeout, "--timeout")
    bound = resolve_impl(op.name, request.impl, request.backend, limit, request.framework, request.device,
                         request.triton_interpret, hints=request.hints).checking(request.check)
    bound.impl.check_declared(request.conventions)
    if request.budget is not None:
        return run_search(request, bound, out)
    cases, narrowing = _cases(request, bound)
    narrowed = narrowed_lines(op, narrowing) if narrowing is not None else []
    bound = bound.declaring(request.conventions)  # (checked above: a hint never judges them otherwise)
    backend = backend_of(bound)
    if backend is not None:
        for case in cases:
            check_world(bound, case)
        if request.world is not None and request.world.rank != 0:
            return _serve_as_peer(request, bound, cases)
    run = Run(op.name, bound.name, backend, bound.device, bound.triton_interpret, request.impl, request.timeout,
              len(cases), len(request.seeds) > 1)
    start = time.perf_counter()
    # What code run in this process prints never mixes with a JSON document on stdout (workers write theirs to a
    # file of their own)
    keep_stdout = contextlib.redirect_stdout(sys.stderr) if reports_to.json else contextlib.nullcontext()
    with SweepReporter(out, reports_to, run, narrowed) as reporter, _interruptible() as interrupted, keep_stdout:
        reports, stopped = _judged(cases, bound, limit, reports_to.maxfail, reporter, interrupted)
    seconds = time.perf_counter() - start
    failed = any(r.verdict == FAIL or (reports_to.strict and r.verdict == KNOWN) for r in reports)
    untested = "" if stopped else nothing_tested(reports)
    status = _SIGNAL_STATUS[interrupted.get("signal", "SIGINT")] if stopped.startswith("interrupted") else \
        2 if untested else 1 if failed else 0
    covered = judged_coverage(op, reports, narrowing) if narrowing is not None else None
    reporter.ended(reports, RunEnd(status, stopped, seconds, limit.describe(), covered,
                                   narrowing_hint(op, reports)))
    if untested:
        why = overruled(narrowing) if narrowing is not None else []
        print(f"normcheck: error: {untested}{''.join('; ' + w for w in why)}", file=sys.stderr)
    if stopped:
        print(f"normcheck: {stopped}: {len(reports)} of {len(cases)} cases ran", file=sys.stderr)
    return status


def _judged(cases: list[Case], bound, limit: CaseLimit, maxfail: int | None, reporter: SweepReporter,
            interrupted: dict) -> tuple[list, str]:
    """Judge `cases` in turn, each report to `reporter` as it comes: (the reports, why the run stopped before its last
    case: "" when it did not)."""
    reports = []
    for case in ahead(cases, lambda c: bound.unsupported(c.with_(order=1)) is None):
        if limit.stuck:
            return reports, limit.stuck
        printed.start()
        try:
            report = judge(case, bound)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see _interruptible): report what ran
            return reports, f"interrupted by {interrupted.get('signal', 'SIGINT')}"
        reports.append(report)
        reporter.judged(report, printed.shown(printed.first()) if report.verdict == FAIL else [])
        # A layer that fails its first cases far beyond any convention may be no norm at all (DyT), or another op's
        # (SimpleNorm run as rmsnorm): one line says so, instead of a row per case
        if why := no_norm(reports, bound) or another_op(reports, bound):
            return reports, why
        if maxfail and sum(r.verdict == FAIL for r in reports) >= maxfail:
            return reports, f"stopped after {maxfail} failing case{'s' if maxfail > 1 else ''} (--maxfail)"
    try:  # (rows judged before a row of their kind was explained: what explained it since)
        reporter.hinted_late([r for r in reports if hint_again(r, bound)])
    except KeyboardInterrupt:
        return reports, f"interrupted by {interrupted.get('signal', 'SIGINT')}"
    return reports, ""


def run_search(request: Request, bound, out) -> int:
    """--budget: judge fresh cases (engine.search) under the narrowing the run's sweep would have, instead of the sweep;
    print the smallest failing case found (its row, replay line, where its errors sit) and the search's summary. Exit
    status as a sweep's: 1 when a case failed, 2 when none was tested."""
    require_hypothesis()
    op, reports_to = request.op, request.reports
    narrowing = run_narrowing(request, bound)
    narrowed = narrowed_lines(op, narrowing)
    bound = bound.declaring(request.conventions)
    backend = backend_of(bound)
    strategy = search_cases(op, narrowing, bound.impl.formats, bound.impl.shares)
    if backend is not None:  # (a case the world cannot run is not drawn)
        strategy = strategy.filter(lambda case: _runs_in(bound, case))
    keep_stdout = contextlib.redirect_stdout(sys.stderr) if reports_to.json else contextlib.nullcontext()
    with Progress(None, f"{op.name} / {bound.name}: searching", wants_progress(quiet=reports_to.json)) as progress, \
            _interruptible() as interrupted, keep_stdout:
        for line in narrowed if not reports_to.json else ():
            progress.print(line, out)
        run = search(bound, strategy, request.budget, seed=request.seed, strict=reports_to.strict,
                     database=database_folder(op.name, request.impl or bound.name, narrowing),
                     on_report=lambda report: progress.advance(), home=cache_root() / "hypothesis")
    found = [] if run.found is None else [run.found]
    status = _SIGNAL_STATUS[interrupted.get("signal", "SIGINT")] if run.interrupted else \
        1 if found else 0 if set(run.verdicts) - {"SKIP"} else 2
    replay = None if run.found is None else report_replay(run.found, backend, request.timeout, request.impl)
    if reports_to.json:
        json.dump(run_document(op.name, bound.name, backend, found, run.seconds, status, request.timeout,
                               time_limit=bound.limit.describe() if bound.limit is not None else None,
                               stopped="interrupted" if run.interrupted else "", device=bound.device,
                               triton_interpret=bound.triton_interpret, narrowed=narrowed, search=run),
                  out, indent=1, allow_nan=False)
        print(file=out)
    else:
        for line in [] if run.found is None else search_lines(run, replay, wants_colour(out)):
            print(line, file=out)
        print(search_summary_line(op.name, bound.name, run), file=out)
    if status == 2:
        print(f"normcheck: error: nothing was tested: the search judged {run.judged} cases in {run.seconds:.1f} s, and "
              "skipped every one", file=sys.stderr)
    return status


def _runs_in(bound, case) -> bool:
    try:
        check_world(bound, case)
    except UsageError:
        return False
    return True


_SIGNAL_STATUS = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as shells report it


@contextlib.contextmanager
def _interruptible():
    """SIGTERM ends the run like Ctrl-C does (a KeyboardInterrupt at the current case), so both keep
    the reports of what ran. Yields a dict that names the signal that arrived."""
    seen: dict[str, str] = {}

    def on_term(signum, frame):
        seen["signal"] = "SIGTERM"
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        yield seen
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _serve_as_peer(request: Request, bound, cases) -> int:
    """Under torchrun every rank runs every case rank 0 runs (as many times as its judge does); rank 0 compares
    and reports, the others stay quiet."""
    for case in cases:
        if bound.unsupported(case):
            continue  # rank 0 skips it too
        try:
            for _ in range(runs_per_case(bound)):
                request.world.run(case, bound.impl.spec)
        except (ImplError, Unsupported):
            pass  # rank 0 reports it
    return 0


def run_list(args, out) -> int:
    if args.coverage:
        if not args.op:
            raise UsageError("--coverage needs --op OP (the op whose default sweep it describes)")
        op = get_op(args.op)
        doc = coverage_document(op, options_narrowing(args, op, declared_conventions(args)))
        print(json.dumps(doc, indent=1, ensure_ascii=False) if args.json else coverage_text(doc), file=out)
        return 0
    ops = [get_op(args.op)] if args.op else list(OPS.values())
    if args.json:
        json.dump([{"op": op.name, "description": op.description, "signature": op.signature,
                    "array_signature": op.array_signature,
                    "impls": [{"name": i.name, "description": i.description, "supports": support_text(i),
                               "follows": dict(i.follows),
                               "known_issues": [{"key": k.key, "summary": k.summary} for k in i.known_issues]}
                              for i in list_impls(op.name)]} for op in ops], out, indent=1)
        print(file=out)
        return 0
    for op in ops:
        print(f"{op.name}: {op.description}", file=out)
        print(f"  --impl module:attr contract: {op.signature}", file=out)
        if op.array_signature:
            print(f"  --framework jax|tf contract: {op.array_signature}", file=out)
        for impl in list_impls(op.name):
            print(f"  {impl.name:<24} {impl.description}; supports {support_text(impl)}", file=out)
            if impl.follows:
                print(f"  {'':<24} follows {', '.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in impl.follows)}",
                      file=out)
            if impl.known_issues:
                print(f"  {'':<24} known upstream issues: {', '.join(k.key for k in impl.known_issues)}", file=out)
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    try:
        args = parse(sys.argv[1:] if argv is None else list(argv))
        try:
            if args.command == "compare":
                return run_compare(compare_request(args), out)
            return {"list": run_list, "doctor": run_doctor}[args.command](args, out)
        finally:
            close_env_world()
    except UsageError as e:
        print(f"normcheck: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the first case ran (starting a world, building a kernel)
        print("normcheck: interrupted before any case ran", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `normcheck ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as shells report it
    except OSError as e:
        if e.errno not in _UNWRITABLE:
            raise
        # `normcheck ... > /dev/full`: the report cannot be written. One line, and nothing left for the exit's flush
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"normcheck: error: the report could not be written: {e.strerror}", file=sys.stderr)
        return _IO_ERROR


# Writing the report failed (a full disk, a quota, a device error), and its exit status (sysexits' EX_IOERR)
_UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)
_IO_ERROR = 74


if __name__ == "__main__":
    sys.exit(main())
