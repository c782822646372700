"""The command line's arguments: the parser of `normcheck compare | list | doctor` and its value types.

It loads no framework (the records it reads are torch-free), so `python -m normcheck` checks a run's arguments before
it imports torch: a usage error is one line at once, not after seconds of imports.
"""
from __future__ import annotations

import argparse
from importlib import metadata

from .cases.case import FROZEN, MODES, OP_FIELDS, ORDERS, takers_of
from .cases.narrowing import SCANS
from .core.errors import UsageError
from .engine.search import budget_seconds
from .numerics.dtypes import COMPUTE_DTYPES, DTYPE_CHOICES, OUTPUT_DTYPES, parse_dtype
from .numerics.formats import FORMATS
from .numerics.profiles import PROFILES
from .ops import CASE_FIELDS, OPS, PARALLEL_LAYOUTS
from .ops.core import CHECKS
from .option_text import order_value
from .worlds import BACKENDS, DEFAULT_TIMEOUT
from .worlds.limits import FLOOR, MULTIPLE, STUCK_AFTER


def parse(argv: list[str]) -> argparse.Namespace:
    """The run's arguments; a UsageError (one line) when they are wrong."""
    return build_parser().parse_args(_joined(argv))


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
    parser.add_argument("--dtype", type=_checked(parse_dtype), help=f"every case in this dtype, one of {', '.join(DTYPE_CHOICES)}")
    parser.add_argument("--memory-format", type=_checked(_formats), help=f"X[:DY], each one of {', '.join(FORMATS)}: every case in this layout")
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
    parser.add_argument("--profile", type=_checked(_profile), help=f"every case's values from this profile, one of {', '.join(PROFILES)}")
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


def _checked(check):
    """An option whose text `check` validates (a UsageError's line, as argparse's), kept as given."""
    def value(text: str) -> str:
        try:
            check(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    value.__name__ = check.__name__.strip("_")
    return value


def _formats(text: str) -> None:
    """X[:DY]: each a memory format's name (which tensor may take which: the case's check)."""
    for name in text.split(":", 1):
        if name not in FORMATS:
            raise UsageError(f"unknown memory format {name!r}; choose one of {', '.join(FORMATS)}")


def _profile(text: str) -> None:
    if text not in PROFILES:
        raise UsageError(f"unknown profile {text!r}; choose one of {', '.join(PROFILES)}")


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




def _field_value(declared):
    """An op field's option parser: argparse's own error line carries the field's one-line message."""
    def value(text: str):
        try:
            return declared.value(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    value.__name__ = declared.option
    return value




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


