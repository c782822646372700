"""`normcheck compare | list`: build cases, run them, print one row per case and a summary."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .cases import DISTRIBUTED_OPS, Case
from .compare import FAIL, KNOWN, MISTRUSTED, PASS, SKIP, VERDICTS, Report, compare
from .dtypes import DTYPE_CHOICES, parse_dtype
from .errors import UsageError
from .layouts import FORMATS
from .ops import OPS, get_op
from .profiles import PROFILES
from .registry import list_impls, resolve_impl
from .sweep import default_sweep
from .runners import ImplError
from .syncbn import BACKENDS, DEFAULT_TIMEOUT, RECIPES, check_world, close_env_world, env_world


def _default_backend(impl) -> str:
    recipe = RECIPES.get(impl.name)
    return recipe.default_backend if recipe else "gloo"

# Case options that, when given, replace the default sweep with explicitly built cases.
_CASE_OPTIONS = ("shape", "dtype", "memory_format", "groups", "profile", "eps", "momentum", "no_affine",
                 "world_size", "split")
_DEFAULT_SHAPE = (4, 6, 5, 5)
_DEFAULT_GROUPS = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 — never a usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="normcheck", description="Check normalization-layer gradients against a float64 reference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    cmp = sub.add_parser("compare", help="compare an implementation with the reference")
    cmp.add_argument("--op", required=True, choices=sorted(OPS))
    cmp.add_argument("--impl", default=None, help="a registered name (see `normcheck list`) or module:attr")
    cmp.add_argument("--shape", type=_shape, help="N,C[,D][,H][,W]")
    cmp.add_argument("--dtype", help=f"one of {', '.join(DTYPE_CHOICES)}")
    cmp.add_argument("--memory-format", help=f"X[:DY], each one of {', '.join(FORMATS)}")
    cmp.add_argument("--groups", type=int, help="GroupNorm groups (C must be divisible)")
    cmp.add_argument("--profile", help=f"one of {', '.join(PROFILES)}")
    cmp.add_argument("--eps", type=float)
    cmp.add_argument("--momentum", type=float, help="running-stat momentum (default 0.1)")
    cmp.add_argument("--no-affine", action="store_true", help="weight and bias are None")
    cmp.add_argument("--world-size", type=int, help="syncbn: number of ranks (the batch is split evenly)")
    cmp.add_argument("--split", type=_split, help="syncbn: per-rank batch sizes, e.g. 3,0,5 (0: an empty rank)")
    cmp.add_argument("--backend", choices=BACKENDS, help="syncbn: where ranks run (default: the recipe's own, "
                     "gloo for torch's function and user code)")
    cmp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="syncbn: seconds per case (default 60)")
    cmp.add_argument("--cases", type=_positive, default=1, help="seeds per case (default 1)")
    cmp.add_argument("--seed", type=int, default=0)
    cmp.add_argument("--strict", action="store_true", help="known upstream issues fail the run too")
    cmp.add_argument("--json", action="store_true", help="print a JSON report instead of the table")

    lst = sub.add_parser("list", help="list ops and implementations")
    lst.add_argument("--op", choices=sorted(OPS))
    lst.add_argument("--json", action="store_true")
    return parser


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    return shape


def _split(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_cases(args) -> list[Case]:
    explicit = any(getattr(args, k) is not None and getattr(args, k) is not False for k in _CASE_OPTIONS)
    seeds = range(args.seed, args.seed + args.cases)
    if not explicit:
        cases = [case for seed in seeds for case in default_sweep(args.op, seed)]
        if args.op in DISTRIBUTED_OPS and args.backend == "env":  # the launcher fixed the world size
            size = env_world(args.timeout).world_size
            cases = [c for c in cases if len(c.split) == size]
            if not cases:
                raise UsageError(f"the default sweep has no case for world size {size}; give --split")
        return cases
    spec = parse_dtype(args.dtype or "f32")
    x_format, _, dy_format = (args.memory_format or "contiguous").partition(":")
    groups = args.groups if args.groups is not None else (_DEFAULT_GROUPS if args.op == "groupnorm" else None)
    shape, split = _shape_and_split(args)
    return [
        Case(args.op, shape, spec.dtype, spec.param_dtype, x_format, dy_format or None,
             args.profile or "normal", 1e-5 if args.eps is None else args.eps,
             0.1 if args.momentum is None else args.momentum, affine=not args.no_affine, groups=groups, seed=seed,
             split=split)
        for seed in seeds
    ]


def _shape_and_split(args) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """--split fixes N when --shape does not; --world-size alone splits N as evenly as possible."""
    if args.op not in DISTRIBUTED_OPS:
        if args.split is not None or args.world_size is not None:
            raise UsageError(f"--split and --world-size apply to syncbn only, not {args.op}")
        return args.shape or _DEFAULT_SHAPE, None
    split = args.split
    if split is not None and args.world_size is not None and len(split) != args.world_size:
        raise UsageError(f"--split has {len(split)} ranks but --world-size is {args.world_size}")
    if split is not None and any(s < 0 for s in split):
        raise UsageError(f"--split {','.join(map(str, split))} has a negative size")
    shape = args.shape or ((sum(split),) + _DEFAULT_SHAPE[1:] if split is not None else _DEFAULT_SHAPE)
    if split is None:
        world = 1 if args.world_size is None else args.world_size
        if world < 1:
            raise UsageError(f"--world-size must be >= 1, got {world}")
        split = tuple(shape[0] // world + (r < shape[0] % world) for r in range(world))
    return shape, split


def run_compare(args, out) -> int:
    if args.backend is not None and args.op not in DISTRIBUTED_OPS:
        raise UsageError(f"--backend applies to syncbn only, not {args.op}")
    impl = resolve_impl(args.op, args.impl, args.backend, args.timeout)
    cases = build_cases(args)
    if args.op in DISTRIBUTED_OPS:
        for case in cases:
            check_world(case, args.backend or _default_backend(impl))
        if args.backend == "env" and env_world(args.timeout).rank != 0:
            return _serve_as_peer(args, impl, cases)
    start = time.perf_counter()
    reports = []
    for case in cases:
        report = compare(args.op, impl, case)
        reports.append(report)
        if not args.json:
            print(_row(report), file=out, flush=True)
            if report.verdict == FAIL:
                print(f"    replay: {replay_command(report)}", file=out, flush=True)
    elapsed = time.perf_counter() - start
    counts = {v: sum(r.verdict == v for r in reports) for v in VERDICTS}
    if args.json:
        json.dump({"op": args.op, "impl": impl.name, "seconds": round(elapsed, 3),
                   "summary": {k.lower(): v for k, v in counts.items()},
                   "cases": [r.to_dict() for r in reports]}, out, indent=1)
        print(file=out)
    else:
        tally = ", ".join(f"{n} {_VERDICT_WORDS[v]}" for v, n in counts.items() if n or v in (PASS, FAIL))
        print(f"{args.op} / {impl.name}: {len(reports)} cases: {tally} in {elapsed:.1f} s", file=out)
    return 1 if counts[FAIL] or (args.strict and counts[KNOWN]) else 0


_VERDICT_WORDS = {PASS: "passed", FAIL: "failed", KNOWN: "known upstream issues", SKIP: "skipped",
                  MISTRUSTED: "mistrusted"}


def replay_command(r: Report) -> str:
    """The command line that re-runs exactly this case."""
    c = r.case
    dtype = f"mixed-{c.dtype}" if c.dtypes.is_mixed else c.dtype
    fmt = c.x_format if c.dy_format == c.x_format else f"{c.x_format}:{c.dy_format}"
    parts = ["normcheck compare", f"--op {r.op}", f"--impl {r.impl}", "--shape " + ",".join(map(str, c.shape)),
             f"--dtype {dtype}", f"--memory-format {fmt}", f"--profile {c.profile}", f"--seed {c.seed}"]
    if c.eps != Case.eps:
        parts.append(f"--eps {c.eps!r}")
    if c.momentum != Case.momentum:
        parts.append(f"--momentum {c.momentum!r}")
    if c.groups is not None:
        parts.append(f"--groups {c.groups}")
    if c.split is not None:
        parts.append("--split " + ",".join(map(str, c.split)))
    if not c.affine:
        parts.append("--no-affine")
    return " ".join(parts)


def _serve_as_peer(args, impl, cases) -> int:
    """Under torchrun every rank runs every case; rank 0 compares and reports, the others stay quiet."""
    spec = RECIPES[impl.name].spec if impl.name in RECIPES else impl.name
    for case in cases:
        try:
            env_world(args.timeout).run(case, spec)
        except ImplError:
            pass  # rank 0 reports it
    return 0


def _row(r: Report) -> str:
    worst = r.worst
    ratio = f"{worst.max_ratio:9.3g}" if worst else " " * 9
    return f"{r.verdict:<10} {ratio}  {r.case.label:<52} {r.summary()}"


def run_list(args, out) -> int:
    ops = [get_op(args.op)] if args.op else list(OPS.values())
    if args.json:
        json.dump([{"op": op.name, "description": op.description, "signature": op.signature,
                    "impls": [{"name": i.name, "description": i.description, "supports": i.capabilities,
                               "known_issues": [{"key": k.key, "summary": k.summary} for k in i.known_issues]}
                              for i in list_impls(op.name)]} for op in ops], out, indent=1)
        print(file=out)
        return 0
    for op in ops:
        print(f"{op.name}: {op.description}", file=out)
        print(f"  --impl module:attr contract: {op.signature}", file=out)
        for impl in list_impls(op.name):
            print(f"  {impl.name:<24} {impl.description}; supports {impl.capabilities}", file=out)
            if impl.known_issues:
                print(f"  {'':<24} known upstream issues: {', '.join(k.key for k in impl.known_issues)}", file=out)
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
        try:
            return {"compare": run_compare, "list": run_list}[args.command](args, out)
        finally:
            close_env_world()
    except UsageError as e:
        print(f"normcheck: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
