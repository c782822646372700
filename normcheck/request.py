"""One `normcheck compare` run as a record: every option read, checked and turned into values once, before anything
runs, so that the run (normcheck.cli) goes down through the layers with values and never reads option text again.

A usage error found here is the run's one line before any case ran or any implementation was loaded. What only the
bound implementation can say (the conventions it follows, what it cannot do) is applied when it is bound:
`Request.conventions` holds what the options declare."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .arguments import _NO_EPS
from .cases.case import CONVENTIONS, OP_FIELDS, Case
from .cases.narrowing import Narrowing, option_fields, rank_limit
from .cases.tokens import decode_case
from .core.errors import UsageError
from .numerics.dtypes import parse_dtype
from .ops import PARALLEL_LAYOUTS, Op, distributed_ops, get_op, laid_out
from .ops.layouts import ROWS
from .option_text import field_value
from .outputs.plot import require_matplotlib
from .worlds.env import EnvWorld, env_world

# Case options beyond the path's (--mode, --frozen, --order, --eps, --momentum, --affine) and the conventions: every
# one fixes its factor on every case of the sweep (cases.narrowing); --one-case builds one case from them instead.
_CASE_OPTIONS = ("shape", "rank", "dtype", "memory_format", *(f for f in OP_FIELDS if f not in CONVENTIONS), "profile",
                 "world_size", "split")
_DEFAULT_SHAPE = (4, 6, 5, 5)
# What names its cases, or reports on the whole sweep: none of it is a search's
_NOT_SEARCHED = ("case", "one_case", "cases", "junit_xml", "plot", "maxfail")


@dataclass(frozen=True)
class Reports:
    """Where and how the run reports: --json on stdout, the JUnit and PNG files, what a FAIL row shows, when to stop."""
    json: bool = False
    junit_xml: str | None = None
    plot: str | None = None
    traceback: bool = False
    maxfail: int | None = None
    strict: bool = False


@dataclass(frozen=True)
class Request:
    """What one run asks. `op`: the record (a parallel layout's op where --backend named one); `impl` .. `check`: what
    binds the implementation (impls.resolve_impl); `conventions`: those the options declare; `named`: the cases a
    --case token or --one-case names (None: the sweep), `token` whether a token named it; `narrowing`: what the case
    options fix of the sweep's design (cases.narrowing), before the implementation's limits; `seeds`: each case's;
    `budget`/`seed`: --budget's search instead of the sweep; `world`: under --backend env, this process's rank of the
    launcher's job (worlds.env), whose size torchrun fixed (the narrowing's world size)."""
    op: Op
    impl: str | None
    backend: str | None
    framework: str | None
    device: str | None
    triton_interpret: bool
    hints: bool
    check: tuple[str, ...]
    timeout: float | None
    conventions: dict
    named: tuple[Case, ...] | None
    token: bool
    narrowing: Narrowing | None
    seeds: tuple[int, ...]
    budget: float | None
    seed: int | None
    reports: Reports
    world: EnvWorld | None = None


def compare_request(args) -> Request:
    """The request of `normcheck compare`'s parsed arguments; UsageError (one line) for options that cannot go
    together or name no case."""
    op = laid_out(args.op, args.backend) if args.backend in PARALLEL_LAYOUTS else get_op(args.op)
    backend = None if args.backend in PARALLEL_LAYOUTS else args.backend
    if backend is not None and not op.distributed:
        raise UsageError(f"--backend applies to {', '.join(distributed_ops())} only, not {op.name}")
    if args.budget is not None:
        _check_search_options(args, backend)
    _check_report_paths(args)
    declared = declared_conventions(args)
    first = args.seed or 0
    seeds = tuple(range(first, first + (args.cases or 1)))
    named = _named_cases(args, op, declared, seeds)
    narrowing = options_narrowing(args, op, declared) if named is None else None
    world, narrowing = _launched(backend, args.timeout, narrowing)
    return Request(op, args.impl, backend, args.framework, args.device, args.triton_interpret, not args.no_hints,
                   tuple(args.check), args.timeout, declared, named, args.case is not None, narrowing,
                   seeds, args.budget, args.seed,
                   Reports(args.json, args.junit_xml, args.plot, args.traceback, args.maxfail, args.strict), world)


def _launched(backend: str | None, timeout: float | None, narrowing: Narrowing | None
              ) -> tuple[EnvWorld | None, Narrowing | None]:
    """Under --backend env, this process's rank of the launcher's job, joined now, and the sweep's narrowing in the
    job's world size (torchrun fixed it: a --world-size that differs is the run's one line)."""
    if backend != "env":
        return None, narrowing
    world = env_world(timeout)
    if narrowing is None:
        return world, None
    if narrowing.world_size not in (None, world.world_size):
        raise UsageError(f"--world-size {narrowing.world_size}: torchrun started {world.world_size} ranks")
    return world, replace(narrowing, world_size=world.world_size)


def declared_conventions(args) -> dict:
    """The conventions the run's options declare (--output-dtype promote, --casting before-weight, ...)."""
    return {k: getattr(args, k) for k in CONVENTIONS if getattr(args, k) is not None}


def options_narrowing(args, op: Op, conventions: dict) -> Narrowing:
    """What the run's case options fix on every case of the sweep (cases.narrowing): each option its factor."""
    _check_world_options(args, op)
    fields = {**conventions, **_fixed(args),
              **option_fields(args.dtype, args.memory_format, args.profile, args.shape, args.split)}
    fields.update({name: getattr(args, name) for name in OP_FIELDS if getattr(args, name) is not None})
    return Narrowing.of(fields, args.world_size, scans=args.scans, limits=rank_limit(args.rank))


def _named_cases(args, op: Op, declared: dict, seeds: tuple[int, ...]) -> tuple[Case, ...] | None:
    """The cases a --case token or --one-case names (under the declared conventions), None for the sweep."""
    given = [k for k in (*_CASE_OPTIONS, "cases", "seed", "one_case") if _is_given(getattr(args, k))]
    fixed = _fixed(args)
    if args.case is not None:  # (beside it, only what a hint may name: the same inputs under another declaration)
        hinted = {f.name for f in _hint_options(op)}
        tried = {k: v for k, v in {**declared, **fixed}.items() if k in hinted}
        refused = [*given, *(k for k in declared if k not in tried),
                   *(("no_affine" if k == "affine" and args.no_affine else k) for k in fixed if k not in tried)]
        return (_token_case(args, op, refused, tried),)
    if args.one_case:
        return _one_case(args, op, declared, fixed, seeds)
    return None


def _fixed(args) -> dict:
    """The fields of the path the run fixes on every case (mode, frozen, order, eps, momentum, affine), as Case values."""
    fixed = {k: getattr(args, k) for k in ("mode", "frozen", "order", "momentum") if getattr(args, k) is not None}
    if args.eps is not None:
        fixed["eps"] = None if args.eps == _NO_EPS else args.eps
    if args.affine is not None or args.no_affine:
        fixed["affine"] = _affine(args)
    return fixed


def _one_case(args, op: Op, conventions: dict, fixed: dict, seeds) -> tuple[Case, ...]:
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
    return tuple(Case(op.name, shape, spec.dtype, spec.param_dtype, x_format, dy_format or None,
                      args.profile or "normal", seed=seed, split=split, **own, **fixed)
                 for seed in seeds)


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
    if case.op != op.name:
        raise UsageError(f"--case token is a {case.op} case, not {op.name}: use --op {case.op}")
    return case.with_(**tried)


def _check_world_options(args, op: Op) -> None:
    if not op.distributed:
        if args.split is not None or args.world_size is not None:
            raise UsageError(f"--split and --world-size apply to {', '.join(distributed_ops())} only, not {op.name}")
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


def _check_search_options(args, backend: str | None) -> None:
    given = [name for name in _NOT_SEARCHED if _is_given(getattr(args, name))]
    if given:
        raise UsageError(f"--budget searches for fresh cases; --{given[0].replace('_', '-')} applies to the sweep or named "
                         "cases: drop one of them")
    if backend == "env":
        raise UsageError("--budget draws cases as it goes, which torchrun's other ranks cannot follow: search in the "
                         "gloo or lockstep world (--backend gloo)")


def _check_report_paths(args) -> None:
    """The report files can be written, and a picture drawn (no traceback after the run)."""
    if args.plot:
        require_matplotlib()
        if Path(args.plot).suffix.lower() != ".png":
            raise UsageError(f"--plot {args.plot}: the picture is a PNG file; give a path ending in .png")
    for option, path in (("--junit-xml", args.junit_xml), ("--plot", args.plot)):
        if path is not None:
            _check_writable(option, Path(path))


def _check_writable(option: str, path: Path) -> None:
    """A report path names a file this process can write."""
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
