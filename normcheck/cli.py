"""`normcheck compare | list`: build cases, run them, print one row per case and a summary."""
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
from pathlib import Path
from textwrap import indent

from .cases import Case
from .cases.case import CONVENTIONS, OP_FIELDS
from .cases.narrowing import Narrowing, option_fields, rank_limit
from .cases.search_space import search_cases
from .cases.sweep import default_sweep
from .cases.tokens import decode_case
from .core.disk_cache import cache_root
from .core.errors import ImplError, Unsupported, UsageError
from .doctor import run_doctor
from .frameworks.torch.triton import INTERPRETER_ELEMENT_SCALE
from .engine import FAIL, KNOWN, ahead, judge, nothing_tested, runs_per_case
from .engine.coverage import judged_coverage, narrowing_hint, overruled
from .engine.normalises import no_norm
from .engine.search import database_folder, require_hypothesis, search
from .impls.limits import learned
from .impls import backend_of, check_world, list_impls, resolve_impl, support_text
from .numerics.dtypes import parse_dtype
from .arguments import _NO_EPS, parse
from .option_text import field_value
from .ops import OPS, PARALLEL_LAYOUTS, Op, distributed_ops, get_op, laid_out
from .ops.layouts import ROWS
from .outputs.coverage import coverage_document, coverage_text
from .outputs.json_report import run_document
from .outputs.junit import write_junit
from .outputs.plot import require_matplotlib, write_plot
from .outputs.progress import Progress, wants_progress
from .outputs.replay import report_replay
from .outputs.table import hint_line, narrowed_lines, row, search_lines, search_summary_line, summary_line, wants_colour
from .worlds import CaseLimit, printed
from .worlds.env import close_env_world, env_world



# Case options beyond the path's (--mode, --frozen, --order, --eps, --momentum, --affine) and the conventions: every
# one fixes its factor on every case of the sweep (cases.narrowing); --one-case builds one case from them instead.
_CASE_OPTIONS = ("shape", "rank", "dtype", "memory_format", *(f for f in OP_FIELDS if f not in CONVENTIONS), "profile",
                 "world_size", "split")
_DEFAULT_SHAPE = (4, 6, 5, 5)


def build_cases(args, op: Op, bound=None) -> tuple[list[Case], Narrowing | None]:
    """The cases to run: a --case token's, --one-case's, or the default sweep narrowed by the case options and by what
    the `bound` implementation cannot do (impls.limits; in the layouts it can express, Impl.formats, and the splits,
    Impl.shares); all in the conventions it follows (Impl.follows) or --weight-offset / --casting say. With the
    narrowing of a sweep (None: the cases were named)."""
    follows = dict(bound.impl.follows) if bound is not None else {}
    conventions = {**follows, **declared_conventions(args)}
    cases, narrowing = _build_cases(args, op, conventions, bound)  # (refuses what no case takes)
    _check_follows(bound, conventions)
    return cases, narrowing


def _check_follows(bound, conventions: dict) -> None:
    """A convention the run declares is the one the implementation follows, where it follows one."""
    for name, value in (bound.impl.follows if bound is not None else ()):
        if conventions[name] != value:
            raise UsageError(f"--{name.replace('_', '-')} {conventions[name]}: {bound.name} follows {name}={value}")


def declared_conventions(args) -> dict:
    """The conventions the run's options declare (--output-dtype promote, --casting before-weight, ...)."""
    return {k: getattr(args, k) for k in CONVENTIONS if getattr(args, k) is not None}


def _fixed(args) -> dict:
    """The fields of the path the run fixes on every case (mode, frozen, order, eps, momentum, affine), as Case values."""
    fixed = {k: getattr(args, k) for k in ("mode", "frozen", "order", "momentum") if getattr(args, k) is not None}
    if args.eps is not None:
        fixed["eps"] = None if args.eps == _NO_EPS else args.eps
    if args.affine is not None or args.no_affine:
        fixed["affine"] = _affine(args)
    return fixed


def _build_cases(args, op: Op, conventions: dict, bound) -> tuple[list[Case], Narrowing | None]:
    given = [k for k in (*_CASE_OPTIONS, "cases", "seed", "one_case") if _is_given(getattr(args, k))]
    fixed = _fixed(args)
    if args.case is not None:  # (beside it, only what a hint may name: the same inputs under another declaration)
        hinted = {f.name for f in _hint_options(op)}
        tried = {k: v for k, v in {**declared_conventions(args), **fixed}.items() if k in hinted}
        refused = [*given, *(k for k in declared_conventions(args) if k not in tried),
                   *(("no_affine" if k == "affine" and args.no_affine else k) for k in fixed if k not in tried)]
        return [_token_case(args, op, refused, tried)], None
    first = args.seed or 0
    seeds = range(first, first + (args.cases or 1))
    if args.one_case:
        return _one_case(args, op, conventions, fixed, seeds), None
    narrowing = run_narrowing(args, op, conventions, bound)
    return [case for seed in seeds
            for case in default_sweep(op, seed, formats=bound and bound.impl.formats,
                                      shares=bound and bound.impl.shares, narrowing=narrowing)], narrowing


def run_narrowing(args, op: Op, conventions: dict, bound) -> Narrowing:
    """What the run's options and the implementation's limits narrow of the design: a sweep's, or a search's."""
    narrowing = narrowing_of(args, op, conventions)
    if bound is not None and bound.triton_interpret:
        narrowing = replace(narrowing, element_scale=INTERPRETER_ELEMENT_SCALE)
    if op.distributed and args.backend == "env":  # the launcher fixed the world size
        size = env_world(args.timeout).world_size
        if narrowing.world_size not in (None, size):
            raise UsageError(f"--world-size {narrowing.world_size}: torchrun started {size} ranks")
        narrowing = replace(narrowing, world_size=size)
    if bound is not None:  # (what it cannot do narrows the design as an option does: impls.limits)
        narrowing = learned(bound, narrowing)
    return narrowing


def narrowing_of(args, op: Op, conventions: dict) -> Narrowing:
    """What the run's case options fix on every case of the sweep (cases.narrowing): each option its factor."""
    _check_world_options(args, op)
    fields = {**conventions, **_fixed(args),
              **option_fields(args.dtype, args.memory_format, args.profile, args.shape, args.split)}
    fields.update({name: getattr(args, name) for name in OP_FIELDS if getattr(args, name) is not None})
    return Narrowing.of(fields, args.world_size, scans=args.scans, limits=rank_limit(args.rank))


def _one_case(args, op: Op, conventions: dict, fixed: dict, seeds) -> list[Case]:
    """--one-case: the case the options describe, their defaults for the rest."""
    spec = parse_dtype(args.dtype or "f32")
    x_format, _, dy_format = (args.memory_format or "contiguous").partition(":")
    own = dict(op.case_fields)  # the op's own fields, defaulted; given ones win (and an op
    own.update({name: getattr(args, name) for name in OP_FIELDS if getattr(args, name) is not None})  # without them says so
    own.update(conventions)
    shape, split = _shape_and_split(args, op)
    if args.rank is not None and len(shape) not in args.rank:
        raise UsageError(f"--rank {','.join(map(str, args.rank))}: --one-case's shape {','.join(map(str, shape))} has "
                         f"{len(shape)} dims (give a --shape of that rank)")
    return [Case(op.name, shape, spec.dtype, spec.param_dtype, x_format, dy_format or None, args.profile or "normal",
                 seed=seed, split=split, **own, **fixed)
            for seed in seeds]


def _affine(args) -> bool | str:
    """--affine both|weight|bias|none (and --no-affine, its old spelling) as Case.affine."""
    if args.no_affine and args.affine not in (None, "none"):
        raise UsageError(f"--no-affine and --affine {args.affine} disagree: give one")
    return field_value("affine", "none" if args.no_affine else (args.affine or "both"))


def _is_given(value) -> bool:
    return value is not None and value is not False  # absent options are None (flags False); 0 is given


def _hint_options(op: Op) -> list:
    """The fields a hint may name (Op.hinted, those it tries: not fp8's, which adds inputs)."""
    return [f for f in op.hinted if f.probed]


def _token_case(args, op: Op, given: list[str], tried: dict) -> Case:
    """A --case token is the whole case: it combines with no other case option but those a hint names (`tried`: the
    op's conventions and the mode, Op.hinted), which judge its inputs under another declaration."""
    if given:
        takes = ", ".join(f"--{f.option}" for f in _hint_options(op))
        raise UsageError(f"--case names the whole case; drop --{given[0].replace('_', '-')} (beside it, a replay line "
                         f"takes only the options a hint names: {takes})")
    case = decode_case(args.case)
    if case.op != args.op:
        raise UsageError(f"--case token is a {case.op} case, not {args.op}: use --op {case.op}")
    return case.with_(**tried)


def _check_world_options(args, op: Op) -> None:
    if not op.distributed:
        if args.split is not None or args.world_size is not None:
            raise UsageError(f"--split and --world-size apply to {', '.join(distributed_ops())} only, not {args.op}")
        return
    split = args.split
    if split is not None and args.world_size is not None and len(split) != args.world_size:
        raise UsageError(f"--split has {len(split)} ranks but --world-size is {args.world_size}")
    if split is not None and any(s < 0 for s in split):
        raise UsageError(f"--split {','.join(map(str, split))} has a negative size")
    if args.world_size is not None and args.world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {args.world_size}")


def _shape_and_split(args, op: Op) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """--split fixes N when --shape does not; --world-size alone splits N as evenly as possible."""
    _check_world_options(args, op)
    if not op.distributed:
        return args.shape or _DEFAULT_SHAPE, None
    split = args.split
    shape = args.shape or _DEFAULT_SHAPE
    if split is not None and not args.shape:  # the split fixes the length of the axis it divides (Op.layout)
        shape = (sum(split),) + shape[1:] if op.layout.axis == ROWS else shape[:-1] + (sum(split),)
    if split is None:
        world = 1 if args.world_size is None else args.world_size
        extent = op.layout.extent(shape)
        split = tuple(extent // world + (r < extent % world) for r in range(world))
    return shape, split


def run_compare(args, out) -> int:
    if args.backend in PARALLEL_LAYOUTS:
        args.op, args.backend = laid_out(args.op, args.backend).name, None
    op = get_op(args.op)  # (fetched once: what follows reads the record)
    if args.backend is not None and not op.distributed:
        raise UsageError(f"--backend applies to {', '.join(distributed_ops())} only, not {args.op}")
    # Report problems found before the run, not after it.
    if args.budget is not None:
        _check_search_options(args)
    limit = CaseLimit(args.timeout, "--timeout")
    if args.plot:
        require_matplotlib()
        if Path(args.plot).suffix.lower() != ".png":
            raise UsageError(f"--plot {args.plot}: the picture is a PNG file; give a path ending in .png")
    for option, path in (("--junit-xml", args.junit_xml), ("--plot", args.plot)):
        if path is not None:
            _check_writable(option, Path(path))
    bound = resolve_impl(args.op, args.impl, args.backend, limit, args.framework, args.device, args.triton_interpret,
                         hints=not args.no_hints)
    bound = bound.checking(args.check)
    if args.budget is not None:
        return run_search(args, op, bound, out)
    cases, narrowing = build_cases(args, op, bound)
    narrowed = narrowed_lines(op, narrowing) if narrowing is not None else []
    bound = bound.declaring(declared_conventions(args))  # (checked by build_cases: a hint never judges them otherwise)
    backend = backend_of(bound)
    if backend is not None:
        for case in cases:
            check_world(bound, case)
        if args.backend == "env" and env_world(args.timeout).rank != 0:
            return _serve_as_peer(args, bound, cases)
    start = time.perf_counter()
    reports = []
    timeout = args.timeout
    colour, seeds = wants_colour(out), (args.cases or 1) > 1
    stopped = ""  # why the run ended before its last case
    # What code run in this process prints never mixes with a JSON document on stdout (workers write theirs to a
    # file of their own)
    keep_stdout = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with Progress(len(cases), f"{args.op} / {bound.name}", wants_progress(quiet=args.json)) as progress, \
            _interruptible() as interrupted, keep_stdout:
        for line in narrowed if not args.json else ():
            progress.print(line, out)
        for case in ahead(cases, lambda c: bound.unsupported(c.with_(order=1)) is None):
            if limit.stuck:
                stopped = limit.stuck
                break
            printed.start()
            try:
                report = judge(case, bound)
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see _interruptible): report what ran
                stopped = f"interrupted by {interrupted.get('signal', 'SIGINT')}"
                break
            reports.append(report)
            progress.advance()
            if not args.json:
                progress.print(row(report, colour, seeds), out)
                if report.verdict == FAIL:
                    if args.traceback and report.traceback:
                        progress.print(indent(report.traceback.rstrip(), "    | "), out)
                    progress.print(f"    replay: {report_replay(report, backend, timeout, args.impl)}", out)
                    hint = hint_line(report)
                    if hint:  # (after the replay line, which scripts read right under the row)
                        progress.print(hint, out)
                    for line in printed.shown(printed.first()):  # (never in --json's document)
                        progress.print(line, out)
            # A layer that fails its first cases far beyond any convention may be no norm at all (DyT): one line
            # says so, instead of a row per case
            if why := no_norm(reports, bound):
                stopped = why
                break
            if args.maxfail and sum(r.verdict == FAIL for r in reports) >= args.maxfail:
                stopped = f"stopped after {args.maxfail} failing case{'s' if args.maxfail > 1 else ''} (--maxfail)"
                break
    elapsed = time.perf_counter() - start
    failed = any(r.verdict == FAIL or (args.strict and r.verdict == KNOWN) for r in reports)
    untested = "" if stopped else nothing_tested(reports)
    status = _SIGNAL_STATUS[interrupted.get("signal", "SIGINT")] if stopped.startswith("interrupted") else \
        2 if untested else 1 if failed else 0
    covered = judged_coverage(op, reports, narrowing) if narrowing is not None else None
    hint = narrowing_hint(op, reports)
    if args.json:
        json.dump(run_document(args.op, bound.name, backend, reports, elapsed, status, timeout, limit.describe(),
                               stopped, bound.device, bound.triton_interpret, covered, narrowed,
                               hint.line() if hint else None),
                  out, indent=1, allow_nan=False)
        print(file=out)
    else:
        print(summary_line(args.op, bound.name, reports, elapsed, covered), file=out)
        if hint is not None:
            print(f"hint: {hint.line()}", file=out)
    if args.junit_xml:
        write_junit(args.junit_xml, args.op, bound.name, backend, reports, elapsed, args.strict, timeout, stopped,
                    len(cases))
    if args.plot:
        write_plot(args.plot, f"{args.op} / {bound.name}", reports)
    if untested:
        why = overruled(narrowing) if narrowing is not None else []
        print(f"normcheck: error: {untested}{''.join('; ' + w for w in why)}", file=sys.stderr)
    if stopped:
        print(f"normcheck: {stopped}: {len(reports)} of {len(cases)} cases ran", file=sys.stderr)
    return status


# What names its cases, or reports on the whole sweep: none of it is a search's
_NOT_SEARCHED = ("case", "one_case", "cases", "junit_xml", "plot", "maxfail")


def _check_search_options(args) -> None:
    given = [name for name in _NOT_SEARCHED if _is_given(getattr(args, name))]
    if given:
        raise UsageError(f"--budget searches for fresh cases; --{given[0].replace('_', '-')} applies to the sweep or named "
                         "cases: drop one of them")
    if args.backend == "env":
        raise UsageError("--budget draws cases as it goes, which torchrun's other ranks cannot follow: search in the "
                         "gloo or lockstep world (--backend gloo)")


def run_search(args, op: Op, bound, out) -> int:
    """--budget: judge fresh cases (engine.search) under the narrowing the run's sweep would have, instead of the sweep;
    print the smallest failing case found (its row, replay line, where its errors sit) and the search's summary. Exit
    status as a sweep's: 1 when a case failed, 2 when none was tested."""
    require_hypothesis()
    conventions = {**dict(bound.impl.follows), **declared_conventions(args)}
    narrowing = run_narrowing(args, op, conventions, bound)
    _check_follows(bound, conventions)
    narrowed = narrowed_lines(op, narrowing)
    bound = bound.declaring(declared_conventions(args))
    backend = backend_of(bound)
    strategy = search_cases(op, narrowing, bound.impl.formats, bound.impl.shares)
    if backend is not None:  # (a case the world cannot run is not drawn)
        strategy = strategy.filter(lambda case: _runs_in(bound, case))
    keep_stdout = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with Progress(None, f"{args.op} / {bound.name}: searching", wants_progress(quiet=args.json)) as progress, \
            _interruptible() as interrupted, keep_stdout:
        for line in narrowed if not args.json else ():
            progress.print(line, out)
        run = search(bound, strategy, args.budget, seed=args.seed, strict=args.strict,
                     database=database_folder(args.op, args.impl or bound.name, narrowing),
                     on_report=lambda report: progress.advance(), home=cache_root() / "hypothesis")
    found = [] if run.found is None else [run.found]
    status = _SIGNAL_STATUS[interrupted.get("signal", "SIGINT")] if run.interrupted else \
        1 if found else 0 if set(run.verdicts) - {"SKIP"} else 2
    replay = None if run.found is None else report_replay(run.found, backend, args.timeout, args.impl)
    if args.json:
        json.dump(run_document(args.op, bound.name, backend, found, run.seconds, status, args.timeout,
                               time_limit=bound.limit.describe() if bound.limit is not None else None,
                               stopped="interrupted" if run.interrupted else "", device=bound.device,
                               triton_interpret=bound.triton_interpret, narrowed=narrowed, search=run),
                  out, indent=1, allow_nan=False)
        print(file=out)
    else:
        for line in [] if run.found is None else search_lines(run, replay, wants_colour(out)):
            print(line, file=out)
        print(search_summary_line(args.op, bound.name, run), file=out)
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


def _check_writable(option: str, path: Path) -> None:
    """A report path names a file this process can write (no traceback after the run)."""
    parent = path.resolve().parent
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give the path of a file")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: directory {parent} does not exist")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot be written ({e.strerror})") from None
    if not existed:
        path.unlink()


def _serve_as_peer(args, bound, cases) -> int:
    """Under torchrun every rank runs every case rank 0 runs (as many times as its judge does); rank 0 compares
    and reports, the others stay quiet."""
    for case in cases:
        if bound.unsupported(case):
            continue  # rank 0 skips it too
        try:
            for _ in range(runs_per_case(bound)):
                env_world(args.timeout).run(case, bound.impl.spec)
        except (ImplError, Unsupported):
            pass  # rank 0 reports it
    return 0


def run_list(args, out) -> int:
    if args.coverage:
        if not args.op:
            raise UsageError("--coverage needs --op OP (the op whose default sweep it describes)")
        op = get_op(args.op)
        doc = coverage_document(op, narrowing_of(args, op, declared_conventions(args)))
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
            return {"compare": run_compare, "list": run_list, "doctor": run_doctor}[args.command](args, out)
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
