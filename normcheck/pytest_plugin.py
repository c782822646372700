"""pytest plugin: gate your own normalization kernel in CI with one option set.

    pytest --normcheck-op syncbn --normcheck-impl mypkg.sync:sync_bn [--normcheck-backend gloo] [--normcheck-framework jax]
           [--normcheck-device cpu|cuda|cuda:N|mps|...] [--normcheck-triton-interpret]
           [--normcheck-profile ci|dev|thorough] [--normcheck-mode eval] [--normcheck-frozen x|params]
           [--normcheck-order 2|fwd|fwd-rev] [--normcheck-eps E] [--normcheck-momentum M] [--normcheck-affine WHICH]
           [--normcheck-dtype D] [--normcheck-shape N,C,...] [--normcheck-rank R[,R]] [--normcheck-memory-format X[:DY]]
           [--normcheck-value-profile P] [--normcheck-groups G] [--normcheck-normalized-dims K]
           [--normcheck-world-size W] [--normcheck-split S,S,...]   (each fixes its factor; the sweep covers the rest)
           [--normcheck-normalized-at trailing|channels] [--normcheck-casting MODE] [--normcheck-weight-offset F] [--normcheck-output-dtype input|promote]
           [--normcheck-compute-dtype f64|f32] [--normcheck-fp8 e4m3|e5m2] [--normcheck-residual-dtype input|f32]
           [--normcheck-follows NAME=VALUE ...]   (any convention the op's record declares, e.g. returns=y)
           [--normcheck-budget 5m [--normcheck-seed N]]   (a budgeted search of fresh cases instead of the sweep)

adds normcheck's suite (normcheck/suite/, shipped inside the package so it runs from any
directory) to whatever else pytest collects: every case of the default sweep as its own test, and
a hypothesis property over generated cases; with --normcheck-budget, instead of those, one test that searches
fresh cases for that long (normcheck.engine.search) and fails with the smallest failing case it finds. Every failure
message ends with the `normcheck compare ... --case TOKEN` line that replays exactly that case.

The plugin is registered with the `pytest11` entry point, so it is loaded wherever normcheck is
installed; without --normcheck-op it adds no tests, loads nothing and changes nothing.
Fixtures for tests of your own: `normcheck_case` (makes Cases) and `normcheck_compare` (compares
and fails the test with a replay line).
"""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUITE_DIR = Path(__file__).resolve().parent / "suite"
SWEEP_SUITE, SEARCH_SUITE = "test_normcheck_suite.py", "test_normcheck_search.py"  # (the run collects one of them)
BACKENDS = ("lockstep", "gloo")  # `env` needs a launcher: use the CLI under torchrun
# normcheck itself is imported only once --normcheck-op is given: without it the plugin loads nothing.


@dataclass(frozen=True)
class Options:
    op: str
    bound: object           # the implementation under test, bound (normcheck.ops.Bound)
    backend: str | None     # the world SyncBN ranks run in; None for single-process ops
    profile: str            # a key of normcheck.cases.budgets.PROFILES
    timeout: float | None   # --normcheck-timeout (None: the limit follows the cases' measured times)
    narrowing: object       # cases.narrowing.Narrowing: what every case takes (the case options given, the conventions)
    interrupted: bool = False  # a signal arrived while the implementation was probed: the first test stops the run
    budget: float | None = None  # --normcheck-budget's seconds: the search instead of the sweep (None: the sweep)
    seed: int | None = None      # --normcheck-seed: the search's draws (None: fresh ones)
    record: object = None        # the op's record (normcheck.ops.Op), fetched once: the sweep and reports read it
    reports: list = field(default_factory=list)  # the sweep's reports, for its coverage as judged


OPTIONS = pytest.StashKey[Options]()
SIGNALS = pytest.StashKey[dict]()  # the signal that interrupted the run, and the handlers it replaced
_STATUS = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as shells report it


_SPELLED_OPTIONS = (
    ("normalized-at", "trailing|channels", "LayerNorm, RMSNorm: the last K dims or dims 1..K"),
    ("casting", "end|before-weight|rstd-input", "RMSNorm: where the layer rounds to the input dtype"),
    ("weight-offset", "F", "RMSNorm: the layer scales by w + F"),
    ("fp8", "e4m3|e5m2", "LayerNorm, RMSNorm: y also returned quantised to fp8, with its amax"),
    ("output-dtype", "input|promote", "the dtype y comes back in: x's, or result_type over x and every parameter "
     "and buffer the layer uses"),
    ("compute-dtype", "f64|f32", "the finest precision the layer computes in"))
_SPELLED = tuple(name.replace("-", "_") for name, _, _ in _SPELLED_OPTIONS)
# The case options beyond the path's: each fixes its factor on every case (--normcheck-profile is hypothesis's budget,
# so the value profile is --normcheck-value-profile)
_NARROWING_OPTIONS = (
    ("dtype", "D", "f64, f32, f16, bf16, mixed-f16 or mixed-bf16"),
    ("shape", "N,C[,D][,H][,W]", "the shape: the sweep covers the rest at it"),
    ("rank", "R[,R...]", "the input ranks (numbers of dims: 4 for a layer written for (N, C, H, W) input)"),
    ("memory-format", "X[:DY]", "the layout of x and dy"),
    ("value-profile", "P", "the value profile: normal, offset, near_constant, ..."),
    ("groups", "G", "GroupNorm: the number of groups"),
    ("normalized-dims", "K", "LayerNorm, RMSNorm: how many dims a set spans"),
    ("residual-dtype", "input|f32", "add + norm: the residual stream's dtype"),
    ("world-size", "W", "distributed ops: the number of ranks"),
    ("split", "S,S,...", "distributed ops: the per-rank shares of the split axis"))


def pytest_addoption(parser):
    group = parser.getgroup("normcheck", "normcheck: gradient checks of normalization kernels")
    group.addoption("--normcheck-op", metavar="OP",
                    help="run normcheck's suite for this op (`normcheck list` names them)")
    group.addoption("--normcheck-impl", metavar="MODULE:ATTR",
                    help="the implementation under test: module:attr, path/to/file.py:attr or a registered "
                         "name (default: torch's own)")
    group.addoption("--normcheck-framework", metavar="NAME",
                    help="the contract a module:attr function follows: torch (default), jax or tf (the op's array "
                         "contract)")
    group.addoption("--normcheck-backend", metavar="BACKEND",
                    help="syncbn: where ranks run, lockstep or gloo (default: gloo for your code)")
    group.addoption("--normcheck-device", metavar="DEVICE",
                    help="where a single-process op's torch implementation gets the case's tensors: cpu (default), "
                         "cuda, cuda:N, mps, ... (as `normcheck compare --device`)")
    group.addoption("--normcheck-triton-interpret", action="store_true",
                    help="run the implementation's Triton kernels in Triton's interpreter in its worker process (as "
                         "`normcheck compare --triton-interpret`)")
    group.addoption("--normcheck-profile", metavar="PROFILE", default="ci",
                    help="hypothesis budget: ci (default, derandomized), dev or thorough")
    for name, values, what in (("mode", "train|eval", "batch or running statistics"),
                               ("frozen", "none|x|params", "which inputs do not require grad"),
                               ("order", "1|2|fwd|fwd-rev", "2: the double backward too; fwd, fwd-rev: forward mode"),
                               ("eps", "E|none", "the eps the layer adds"),
                               ("momentum", "M", "the running statistics' momentum"),
                               ("affine", "both|weight|bias|none", "the parameters given")):
        group.addoption(f"--normcheck-{name}", metavar=values,
                        help=f"every case takes this value ({what}); default: the sweep's own mix")
    for name, values, what in _NARROWING_OPTIONS:
        group.addoption(f"--normcheck-{name}", metavar=values, help=f"every case takes this value ({what}); the sweep "
                        "covers the rest (as `normcheck compare --" + name.replace("value-", "") + "`)")
    # The conventions with an option of their own (this module imports no normcheck until --normcheck-op is given,
    # so it cannot read the ops' records here); any convention a record declares is --normcheck-follows NAME=VALUE
    for name, values, what in _SPELLED_OPTIONS:
        group.addoption(f"--normcheck-{name}", metavar=values, help=f"the convention the implementation follows ({what}; "
                        "as `normcheck compare --" + name + "`)")
    group.addoption("--normcheck-scans", metavar="with|without|only", default="with", choices=("with", "without", "only"),
                    help="the boundary scans: after the covering design's cases (the default), left out, or alone "
                         "(as `normcheck compare --scans`)")
    group.addoption("--normcheck-follows", metavar="NAME=VALUE", action="append", default=[],
                    help="any convention the op's record declares (repeatable), e.g. returns=y for add + norm; "
                         "`normcheck compare --help` lists them")
    group.addoption("--normcheck-check", metavar="PROPERTY", action="append", default=[],
                    choices=("batch-invariance",), help="a property checked on every case beside the values: "
                    "batch-invariance (each case's rows rerun in other batches must give the same bits; `normcheck "
                    "compare --help` says more)")
    group.addoption("--normcheck-budget", metavar="DURATION",
                    help="search fresh cases for this long (300, 300s, 5m, 1h) instead of the default sweep and the "
                         "generated cases: one test, failing with the smallest failing case found, its replay line and "
                         "where its errors sit (as `normcheck compare --budget`)")
    group.addoption("--normcheck-seed", metavar="N", type=int, default=None,
                    help="with --normcheck-budget: the search's seed (default: a fresh one, which a failure names)")
    group.addoption("--normcheck-timeout", metavar="S", type=float, default=None,
                    help="seconds per case before an implementation counts as hung (default: 20 × the larger of "
                         "the float64 reference's time on the case and the longest finished case, at least 1.5 s; "
                         "60 s for the first case; once 10 cases timed out and none finished, the rest fail unrun)")


def pytest_configure(config):
    if config.getoption("normcheck_op") is None:
        for name in ("impl", "backend", "framework", "device", "triton_interpret", "budget"):
            if config.getoption(f"normcheck_{name}") not in (None, False):
                raise pytest.UsageError(f"--normcheck-{name.replace('_', '-')} needs --normcheck-op")
        return
    config.stash[SIGNALS] = _catch_signals()  # (first: probing the implementation runs it)
    config.stash[OPTIONS] = _options(config)
    config.args.append(str(SUITE_DIR))  # collected beside the user's own tests, from any rootdir


def _catch_signals() -> dict:
    """SIGTERM ends a gated run the way Ctrl-C does: pytest stops at the current test, reports what
    ran and writes its JUnit file; the worker processes of the case that was running are killed."""
    seen: dict = {"previous": {}}
    if threading.current_thread() is not threading.main_thread():
        return seen

    def interrupted(signum, frame):
        seen["signal"] = signal.Signals(signum).name
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        seen["previous"][sig] = signal.signal(sig, interrupted)
    return seen


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    seen = session.config.stash.get(SIGNALS, {})
    if exitstatus == pytest.ExitCode.INTERRUPTED and seen.get("signal") in _STATUS:
        session.exitstatus = _STATUS[seen["signal"]]  # what pytest returns


def pytest_ignore_collect(collection_path, config):
    # Inert without --normcheck-op: even `pytest path/to/normcheck` leaves the suite alone.
    if OPTIONS not in config.stash and SUITE_DIR in (collection_path, *collection_path.parents):
        return True
    if OPTIONS in config.stash and collection_path.parent == SUITE_DIR and collection_path.name in (SWEEP_SUITE,
                                                                                                  SEARCH_SUITE):
        wanted = SEARCH_SUITE if config.stash[OPTIONS].budget is not None else SWEEP_SUITE
        return collection_path.name != wanted or None
    return None


def pytest_report_header(config):
    if OPTIONS in config.stash:
        o = config.stash[OPTIONS]
        world = f", {o.backend} world" if o.backend else f", on {o.bound.device}" if o.bound.device != "cpu" else ""
        world += ", Triton's interpreter" if o.bound.triton_interpret else ""
        from normcheck.outputs.table import narrowed_lines

        return [f"normcheck: {o.op} / {o.bound.name}{world}, hypothesis profile {o.profile}",
                *(f"normcheck: {line}" for line in narrowed_lines(o.record, o.narrowing))]
    return None


def pytest_terminal_summary(terminalreporter, config):
    """The sweep's coverage as judged (engine.coverage): the pairs its judged cases covered of those designed, and
    what none covered, with why."""
    if OPTIONS not in config.stash or not config.stash[OPTIONS].reports:
        return
    from normcheck.engine.coverage import judged_coverage, narrowing_hint

    o = config.stash[OPTIONS]
    covered = judged_coverage(o.record, o.reports, o.narrowing)
    terminalreporter.write_line(f"normcheck: {o.op} / {o.bound.name}: {covered.text()} of the default sweep")
    for line in covered.never:
        terminalreporter.write_line(f"normcheck: never judged: {line}")
    hint = narrowing_hint(o.record, o.reports)
    if hint is not None:
        terminalreporter.write_line(f"normcheck: hint: {hint.line('--normcheck-')}")


def pytest_unconfigure(config):
    for sig, handler in config.stash.get(SIGNALS, {}).get("previous", {}).items():
        signal.signal(sig, handler)
    if OPTIONS in config.stash:  # (the probes of what it cannot do started them, even to collect)
        from normcheck.worlds.workers import close_all

        close_all()  # stop the worker processes now rather than at interpreter exit


def _options(config) -> Options:
    op = config.getoption("normcheck_op")
    profile = config.getoption("normcheck_profile")
    backend = config.getoption("normcheck_backend")
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise pytest.UsageError('the normcheck suite needs hypothesis: pip install "normcheck[pytest]"') from None
    from normcheck.cases.budgets import PROFILES
    from normcheck.cases.case import CONVENTIONS, default_conventions
    from normcheck.cases.narrowing import Narrowing, rank_limit
    from normcheck.frameworks.torch.triton import INTERPRETER_ELEMENT_SCALE
    from normcheck.impls.limits import learned
    from normcheck.cases.sweep import default_sweep
    from normcheck.option_text import field_value
    from normcheck.core.errors import UsageError
    from normcheck.engine.search import budget_seconds
    from normcheck.impls import backend_of, resolve_impl
    from normcheck.ops import CASE_FIELDS, OPS, distributed_ops

    if op not in OPS:
        raise pytest.UsageError(f"--normcheck-op {op!r} is not an op; choose one of {', '.join(OPS)}")
    if profile not in PROFILES:
        raise pytest.UsageError(f"--normcheck-profile {profile!r}: choose one of {', '.join(PROFILES)}")
    if backend is not None and not OPS[op].distributed:
        raise pytest.UsageError(f"--normcheck-backend applies to {', '.join(distributed_ops())} only, not {op}")
    if backend is not None and backend not in BACKENDS:
        raise pytest.UsageError(f"--normcheck-backend {backend!r}: choose one of {', '.join(BACKENDS)} "
                                "(for torchrun's env world use `normcheck compare --backend env`)")
    from normcheck.worlds import CaseLimit

    timeout = config.getoption("normcheck_timeout")
    budget = config.getoption("normcheck_budget")
    try:
        budget = None if budget is None else budget_seconds(budget)
    except UsageError as e:
        raise pytest.UsageError(f"--normcheck-{e}") from None
    try:
        bound = resolve_impl(op, config.getoption("normcheck_impl"), backend, CaseLimit(timeout, "--normcheck-timeout"),
                             config.getoption("normcheck_framework"), config.getoption("normcheck_device"),
                             config.getoption("normcheck_triton_interpret"))
    except UsageError as e:
        raise pytest.UsageError(str(e).replace("--impl ", "--normcheck-impl ", 1)
                                .replace("--device ", "--normcheck-device ", 1)
                                .replace("--triton-interpret", "--normcheck-triton-interpret", 1)) from None
    try:
        interrupted = False
        fixed = {name: field_value(name, config.getoption(f"normcheck_{name}")) for name in _PATH
                 if config.getoption(f"normcheck_{name}") is not None}
        spelled = {name: field_value(name, text) for name, text in _conventions_given(config, CASE_FIELDS)}
        declared = {name: value for name, value in spelled.items() if name in CONVENTIONS}
        bound.impl.check_declared(declared, "--normcheck-")
        follows = {**default_conventions(op), **dict(bound.impl.follows), **declared}  # (generated cases draw them all)
        narrowing = Narrowing.of({**follows, **spelled, **fixed, **_narrowing_fields(config)},
                                 _given(config, "world_size"),
                                 INTERPRETER_ELEMENT_SCALE if bound.triton_interpret else None,
                                 config.getoption("normcheck_scans"),
                                 rank_limit(_given(config, "rank"), "--normcheck-rank"))
        if narrowing.world_size is not None and not OPS[op].distributed:
            raise UsageError(f"--normcheck-world-size applies to {', '.join(distributed_ops())} only, not {op}")
        default_sweep(OPS[op], narrowing=narrowing)  # what no case can take is refused now, in one line
        try:  # (what it cannot do narrows the design as an option does: impls.limits)
            narrowing = learned(OPS[op], bound, narrowing)
        except KeyboardInterrupt:  # (Ctrl-C or SIGTERM while it ran: the run stops at its first test, reporting)
            interrupted = True
    except UsageError as e:
        raise pytest.UsageError(str(e)) from None
    bound = bound.checking(config.getoption("normcheck_check")).declaring(declared)  # (a hint never probes them)
    return Options(op, bound, backend_of(bound), profile, timeout, narrowing, interrupted, budget=budget,
                   seed=config.getoption("normcheck_seed"), record=OPS[op])


# The path's options (each a Case field of that name)
_PATH = ("mode", "frozen", "order", "eps", "momentum", "affine")


def _narrowing_fields(config) -> dict:
    """The Case fields the narrowing options give (UsageError for a value that is not one)."""
    from normcheck.cases.narrowing import option_fields

    fields = option_fields(config.getoption("normcheck_dtype"), config.getoption("normcheck_memory_format"),
                           config.getoption("normcheck_value_profile"), _given(config, "shape"),
                           _given(config, "split"))
    fields.update({name: _given(config, name) for name in ("groups", "normalized_dims", "residual_dtype")
                   if config.getoption(f"normcheck_{name}") is not None})
    return fields


def _given(config, name: str):
    """The Case value of a --normcheck-NAME option given as text (option_text.field_value), None where not given."""
    from normcheck.option_text import field_value
    from normcheck.core.errors import UsageError

    text = config.getoption(f"normcheck_{name}")
    try:
        return None if text is None else field_value(name, text)
    except UsageError as e:  # (its message starts with the option's name)
        raise UsageError(f"--normcheck-{e}") from None


def _conventions_given(config, conventions) -> list[tuple[str, str]]:
    """(name, text) of each op field the run gives: a convention's own option, or --normcheck-follows NAME=VALUE."""
    given = [(name, config.getoption(f"normcheck_{name}")) for name in _SPELLED
             if config.getoption(f"normcheck_{name}") is not None]
    for item in config.getoption("normcheck_follows"):
        name, equals, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not equals or name not in conventions:
            from normcheck.core.errors import UsageError
            raise UsageError(f"--normcheck-follows {item!r}: give NAME=VALUE with NAME one of "
                             f"{', '.join(c.replace('_', '-') for c in conventions)}")
        given.append((name, text.strip()))
    return given


def failure_message(report, backend: str | None, impl_spec: str | None = None, timeout: float | None = None) -> str:
    """What every failing normcheck test says: the case, what went wrong, how to replay it, and the first lines the
    implementation printed in the case's run (worlds.printed: the judge was started with printed.start())."""
    from normcheck.outputs.replay import replay_command
    from normcheck.worlds import printed

    hint = "" if report.hint is None else f"\nhint: {report.hint.text(declared_option)}"
    output = "".join(f"\n{line}" for line in printed.shown(printed.first()))
    return (f"{report.verdict} {report.case.label}: {report.summary()}\n"
            f"replay: {replay_command(report.op, impl_spec or report.impl, report.case, backend, timeout, report.framework, report.device, report.triton_interpret)}"
            f"{hint}{output}")


def declared_option(name: str, value) -> str:
    """How this plugin declares a convention: its own option (the mode's: --normcheck-mode eval), or
    --normcheck-follows NAME=VALUE."""
    from normcheck.engine.hints import value_text

    if name in _SPELLED or name in _PATH:
        return f"--normcheck-{name.replace('_', '-')} {value_text(value)}"
    return f"--normcheck-follows {name}={value_text(value)}"


@pytest.fixture(scope="session")
def normcheck_options(pytestconfig) -> Options:
    """The run's --normcheck-* options (the implementation already resolved)."""
    if OPTIONS not in pytestconfig.stash:
        pytest.skip("no --normcheck-op given")
    return pytestconfig.stash[OPTIONS]


@pytest.fixture
def normcheck_case(pytestconfig):
    """Make a Case: `normcheck_case((8, 3, 5, 5), dtype="bf16", x_format="channels_last")`, or paste a
    replay token: `normcheck_case("v1....")`. The op defaults to --normcheck-op; give op=... otherwise."""
    from normcheck.cases import Case
    from normcheck.cases.tokens import decode_case

    default_op = pytestconfig.getoption("normcheck_op")

    def make(shape_or_token, op: str | None = None, **fields) -> Case:
        if isinstance(shape_or_token, str):
            return decode_case(shape_or_token)
        op = op or default_op
        if op is None:
            raise ValueError("normcheck_case: give op=... (or run pytest with --normcheck-op)")
        return Case(op, tuple(shape_or_token), **fields)

    return make


@pytest.fixture
def normcheck_compare():
    """Compare an implementation with the float64 reference on one case and return the Report; a FAIL
    fails the test with the replay line. `impl`: a function, module:attr or registered name; for
    syncbn a function must be importable by name (its ranks run in other processes)."""
    from normcheck.core.loading import spec_of
    from normcheck.engine import FAIL, judge
    from normcheck.impls import backend_of, resolve_impl
    from normcheck.worlds import printed

    def check(impl, case, backend: str | None = None, timeout: float | None = None, device: str | None = None,
              triton_interpret: bool = False):
        resolved = resolve_impl(case.op, impl, backend, timeout, device=device, triton_interpret=triton_interpret)
        printed.start()
        report = judge(case, resolved)
        if report.verdict == FAIL:
            # A function is replayed by the name it is importable under.
            spec = spec_of(impl) if callable(impl) else None
            pytest.fail(failure_message(report, backend_of(resolved), spec, timeout), pytrace=False)
        return report

    return check
