"""`normcheck compare | list`: build cases, run them, print one row per case and a summary."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from textwrap import indent

from .cases import Case
from .cases.case import CONVENTIONS, FROZEN, MODES, OP_FIELDS, ORDERS, takers_of
from .cases.narrowing import SCANS, Narrowing, option_fields, rank_limit
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
from .engine.search import budget_seconds, database_folder, require_hypothesis, search
from .impls.limits import learned
from .impls import backend_of, check_world, list_impls, resolve_impl, support_text
from .numerics.dtypes import COMPUTE_DTYPES, DTYPE_CHOICES, OUTPUT_DTYPES, parse_dtype
from .numerics.formats import FORMATS
from .option_text import field_value, order_value
from .numerics.profiles import PROFILES
from .ops.core import CHECKS
from .ops import CASE_FIELDS, OPS, PARALLEL_LAYOUTS, Op, distributed_ops, get_op, laid_out
from .ops.layouts import ROWS
from .outputs.coverage import coverage_document, coverage_text
from .outputs.json_report import run_document
from .outputs.junit import write_junit
from .outputs.plot import require_matplotlib, write_plot
from .outputs.progress import Progress, wants_progress
from .outputs.replay import report_replay
from .outputs.table import hint_line, narrowed_lines, row, search_lines, search_summary_line, summary_line, wants_colour
from .worlds import BACKENDS, DEFAULT_TIMEOUT, CaseLimit, close_env_world, env_world, printed
from .worlds.limits import FLOOR, MULTIPLE, STUCK_AFTER



# Case options beyond the path's (--mode, --frozen, --order, --eps, --momentum, --affine) and the conventions: every
# one fixes its factor on every case of the sweep (cases.narrowing); --one-case builds one case from them instead.
_CASE_OPTIONS = ("shape", "rank", "dtype", "memory_format", *(f for f in OP_FIELDS if f not in CONVENTIONS), "profile",
                 "world_size", "split")
_DEFAULT_SHAPE = (4, 6, 5, 5)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 — never a usage dump
        raise UsageError(message)


def _version() -> str:
    try:
        return metadata.version("normcheck")
    except metadata.PackageNotFoundError:  # a checkout on sys.path that pip never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="normcheck", description="Check normalization-layer gradients against a float64 reference.")
    parser.add_argument("--version", action="version", version=f"normcheck {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    cmp = sub.add_parser("compare", help="compare an implementation with the reference")
    cmp.add_argument("--op", required=True, choices=sorted(OPS))
    cmp.add_argument("--impl", default=None, help="a registered name (see `normcheck list`) or module:attr")
    cmp.add_argument("--framework", metavar="NAME", help="the contract a module:attr function follows: torch (the "
                     "default), or jax / tf (the op's array contract, `normcheck list`)")
    _add_case_options(cmp)
    cmp.add_argument("--backend", choices=BACKENDS + PARALLEL_LAYOUTS, help="a distributed op's world: where ranks "
                     "run (default: the recipe's own, gloo for torch's function and user code); or a parallel layout "
                     "of layernorm or rmsnorm, which runs its parallel op in its own world (--op layernorm --backend "
                     "sequence-parallel is --op layernorm_sp)")
    cmp.add_argument("--device", metavar="DEVICE", help="where a single-process op's torch implementation gets the "
                     "case's tensors (same strides and storage offsets): cpu (the default), cuda, cuda:N or any other "
                     "device torch names (mps, xpu, ...); outputs come back to the CPU for the comparison")
    cmp.add_argument("--triton-interpret", action="store_true", help="run the implementation's Triton kernels in "
                     "Triton's interpreter (TRITON_INTERPRET=1 in its worker process, set before its module is "
                     "imported): Triton kernels judged on a CPU; the cases the interpreter cannot run (bf16, fp8) are "
                     "SKIP rows (needs the triton extra)")
    cmp.add_argument("--check", action="append", choices=CHECKS, default=[], help="a property to check on every case "
                     "beside the reference's values: batch-invariance (each case's rows run again in batches of other "
                     "sizes and at other positions; their y, dx and other x-shaped outputs must be bitwise the same; "
                     "ops whose rows depend on each other, training BatchNorm and the distributed ops, skip saying why)")
    cmp.add_argument("--timeout", type=float, metavar="S",
                     help=f"seconds per case (default: {MULTIPLE:g} × the larger of the float64 reference's time on "
                          f"the case and the longest finished case, at least {FLOOR:g} s; {DEFAULT_TIMEOUT:g} s for the "
                          f"first case; the run stops when {STUCK_AFTER} cases timed out and none finished)")
    cmp.add_argument("--cases", type=_positive, help="seeds per case (default 1)")
    cmp.add_argument("--seed", type=_non_negative, help="first seed (default 0); with --budget, the search's (default: "
                     "a fresh one, printed: the same seed draws the same cases)")
    cmp.add_argument("--budget", type=_budget, metavar="DURATION", help="search instead of the default sweep: judge "
                     "fresh cases (sizes k·2^j − 1, k·2^j, k·2^j + 1 for odd k up to 31, and any other; fresh "
                     "combinations of the other factors; fresh seeds), narrowed as the sweep by the case options, for "
                     "this long (300, 300s, 5m, 1h); shrink a failing case to the smallest that fails, and print it "
                     "with its replay line and where its errors sit")
    cmp.add_argument("--case", metavar="TOKEN", help="run exactly the case of a replay line's token")
    cmp.add_argument("--strict", action="store_true", help="known upstream issues fail the run too")
    cmp.add_argument("--no-hints", action="store_true", help="judge no failing case again under the conventions the "
                     "implementation did not declare (by default the first failing cases are, and a row that passes "
                     "under some says so in a hint line; never a verdict)")
    cmp.add_argument("--maxfail", type=_positive, metavar="N",
                     help="stop after N failing cases (the reports cover what ran)")
    cmp.add_argument("--traceback", action="store_true",
                     help="after a row whose implementation raised, print the whole stack")
    cmp.add_argument("--json", action="store_true",
                     help="print a JSON report instead of the table (schema: docs/json-schema.md)")
    cmp.add_argument("--junit-xml", metavar="PATH", help="also write a JUnit XML report, one testcase per case")
    cmp.add_argument("--plot", metavar="PNG",
                     help="also draw budget ratios per channel or group (needs the plot extra)")

    cmp.add_argument("--one-case", action="store_true", help="run one case built from the case options (their "
                     "defaults for the rest: 4,6,5,5 f32 contiguous normal) instead of the sweep they narrow")

    lst = sub.add_parser("list", help="list ops and implementations")
    lst.add_argument("--op", choices=sorted(OPS))
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--coverage", action="store_true",
                     help="with --op: what its default sweep covers (each factor value and pair of values, with "
                          "how many cases cover it); with case options, the sweep they narrow")
    _add_case_options(lst)

    sub.add_parser("doctor", help="what this machine can run: torch, CUDA, nvcc, normcheck's kernels")
    return parser


def _add_case_options(parser) -> None:
    """The case options, shared by compare and list --coverage. Each fixes its factor on every case of the sweep, and
    the covering design covers the rest (--one-case: one case built from them instead)."""
    parser.add_argument("--shape", type=_int_list, help="N,C[,D][,H][,W]: every case has this shape (the sweep covers "
                        "dtypes, layouts, profiles, eps and paths at it)")
    parser.add_argument("--rank", type=_int_list, metavar="R[,R...]", help="every case has an input of these ranks "
                        "(numbers of dims: 4 for a layer written for (N, C, H, W) input); the sweep covers the rest")
    parser.add_argument("--dtype", help=f"every case in this dtype, one of {', '.join(DTYPE_CHOICES)}")
    parser.add_argument("--memory-format", help=f"X[:DY], each one of {', '.join(FORMATS)}: every case in this layout")
    for f in (CASE_FIELDS[name] for name in OP_FIELDS):  # the ops' own fields, as their records declare them
        parser.add_argument(f"--{f.option}", type=_field_value(f), metavar=f.metavar or "|".join(map(str, f.choices)) or None,
                         help=f"{', '.join(takers_of(f.name))}: {f.help}")
    parser.add_argument("--output-dtype", choices=OUTPUT_DTYPES, help="the dtype the implementation returns y in: input "
                     "(x's, the default) or promote (result_type over x and every floating parameter and buffer the layer uses "
                     "in the case: weight, bias, and the running statistics in eval mode; f32 for f16/bf16 x with any "
                     "of them in f32)")
    parser.add_argument("--compute-dtype", choices=COMPUTE_DTYPES, help="the finest precision the implementation "
                     "computes in: f64 (as fine as the input, the default) or f32 (float32 at most: f64 cases get "
                     "float32's budget)")
    parser.add_argument("--mode", choices=MODES, help="train (batch statistics, the default) or eval (running "
                     "statistics, left unchanged): batchnorm, syncbn, instancenorm")
    parser.add_argument("--frozen", choices=FROZEN, help="which inputs do not require grad: x (only parameter "
                     "gradients), params (only dx) or none (the default)")
    parser.add_argument("--order", type=_order, choices=ORDERS, metavar="|".join(map(str, ORDERS)),
                     help="1; 2: also the double backward (the gradients of <ddx, dx> + <ddw, dw> + <ddb, db> for "
                     "random cotangents); fwd: forward mode, the JVP of y along random tangents of x, w, b; fwd-rev: "
                     "forward-over-reverse, the backward and the JVPs of y and of the gradients (Hessian-vector "
                     "products)")
    parser.add_argument("--profile", help=f"every case's values from this profile, one of {', '.join(PROFILES)}")
    parser.add_argument("--eps", type=_eps, help="a number, or none (RMSNorm: the dtype's default)")
    parser.add_argument("--momentum", type=float, help="running-stat momentum (default 0.1)")
    parser.add_argument("--no-affine", action="store_true", help="weight and bias are None (--affine none)")
    parser.add_argument("--affine", metavar="WHICH", help="the parameters given: both (default), weight, bias or none")
    parser.add_argument("--world-size", type=int, help="distributed ops: every case over this many ranks (the sweep's splits of that many ranks; "
                        "with --one-case the extent is split evenly)")
    parser.add_argument("--split", type=_int_list, help="distributed ops: every case with these per-rank shares of the split axis, e.g. 3,0,5 (0: an empty rank)")
    parser.add_argument("--scans", choices=SCANS, default="with", help="the boundary scans (each size factor through "
                        "every k·2^j − 1, k·2^j, k·2^j + 1, k = 1 or 3): after the covering design's cases (with, the "
                        "default), left out (without: a quicker run) or alone (only: chasing a tile or vector path)")


def _int_list(text: str) -> tuple[int, ...]:
    """'3,0,5' -> (3, 0, 5): --shape and --split."""
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


_NO_EPS = "none"  # --eps none: the op's default for the dtype (Case.eps None)


def _order(text: str) -> int | str:
    try:
        return order_value(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _eps(text: str) -> float | str:
    if text.lower() == _NO_EPS:
        return _NO_EPS
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or none") from None


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _budget(text: str) -> float:
    try:
        return budget_seconds(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--budget ")) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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
    if args.case is not None:
        return [_token_case(args, [*given, *(k for k in CONVENTIONS if getattr(args, k) is not None),
                                   *(("no_affine" if k == "affine" and args.no_affine else k) for k in fixed)])], None
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


def _field_value(declared):
    """An op field's option parser: argparse's own error line carries the field's one-line message."""
    def value(text: str):
        try:
            return declared.value(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    value.__name__ = declared.option
    return value


def _is_given(value) -> bool:
    return value is not None and value is not False  # absent options are None (flags False); 0 is given


def _token_case(args, given: list[str]) -> Case:
    """A --case token is the whole case: it combines with no other case option."""
    if given:
        raise UsageError(f"--case names the whole case; drop --{given[0].replace('_', '-')}")
    case = decode_case(args.case)
    if case.op != args.op:
        raise UsageError(f"--case token is a {case.op} case, not {args.op}: use --op {case.op}")
    return case


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


# Options whose value may start with "-" (a negative number): argparse would read "-4,3,5" as an option
_NUMERIC_VALUES = ("--shape", "--split", "--eps", "--momentum", "--weight-offset")


def _joined(argv: list[str]) -> list[str]:
    """`--shape -4,3,5` as `--shape=-4,3,5`, so that a negative value gets its own clear error, not argparse's
    "expected one argument"."""
    out = []
    for arg in argv:
        if out and out[-1] in _NUMERIC_VALUES and arg[:1] == "-" and arg[1:2].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(_joined(sys.argv[1:] if argv is None else list(argv)))
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


if __name__ == "__main__":
    sys.exit(main())
