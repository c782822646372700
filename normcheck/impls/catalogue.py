"""The implementation catalogue: every Impl record, and binding a record to the world it runs in.

One table (`IMPLS`, op -> name -> Impl) holds them all: torch's own from the op records, normcheck's
same-precision baseline, our GroupNorm kernel (and torch's beside it at fixed thread counts), the
SyncBN recipes, and whatever users `register`. `resolve_impl` turns a name, a `module:attr` spec,
a function or a record into a bound one (ops.core.Bound: the record and its world, runner, device, ...), which the
engine judges.
"""
from __future__ import annotations

import pickle
from dataclasses import replace
from functools import partial
from typing import Callable

from ..core.errors import UsageError
from ..core.loading import Code, absolute_spec, load_code
from ..engine.baseline import baseline_outputs
from ..engine.hints import HintSearch
from ..frameworks import FRAMEWORKS
from ..frameworks.arrays import formats_of
from ..frameworks.torch.layers import Layer, is_factory, is_layer_class, is_layer_instance
from ..frameworks.torch.tensors import device_missing
from ..frameworks.torch.triton import Interpreted, interpreter_missing
from ..kernels.groupnorm.impls import IMPLS as GROUPNORM_KERNEL_IMPLS
from ..kernels.syncbn.recipes import IMPLS as SYNCBN_RECIPES
from ..kernels.parallel import IMPLS as PARALLEL_TEXTBOOKS
from ..ops import OPS, Bound, Impl, get_op
from ..ops.core import ALL_ORDERS, supports_everything
from ..worlds import BACKENDS, WORLDS, CaseLimit, as_limit, default_world, get_world
from .frameworks import IMPLS as FRAMEWORK_IMPLS

BASELINES = tuple(
    Impl("baseline", op.name, "normcheck's same-precision baseline (float32 accumulation)", baseline_outputs,
         convention="direct", framework="numpy", orders=ALL_ORDERS)  # (it computes the directional derivatives too)
    for op in OPS.values() if not op.distributed
)

IMPLS: dict[str, dict[str, Impl]] = {name: {} for name in OPS}


def register(impl: Impl) -> Impl:
    get_op(impl.op)
    IMPLS[impl.op][impl.name] = impl
    return impl


for _impl in (*(i for op in OPS.values() for i in op.impls), *BASELINES, *SYNCBN_RECIPES, *PARALLEL_TEXTBOOKS, *GROUPNORM_KERNEL_IMPLS,
              *FRAMEWORK_IMPLS):
    register(_impl)
# What every process that imports normcheck has: a worker rebuilds these records by name.
_BUILT_IN = {(i.op, i.name): i for ops in IMPLS.values() for i in ops.values()}


def list_impls(op: str) -> list[Impl]:
    get_op(op)
    return list(IMPLS[op].values())


def worlds_of(impl: Impl) -> tuple[str, ...]:
    """The worlds an implementation can run in."""
    if not get_op(impl.op).distributed:
        return ("isolated", "in-process")
    return impl.worlds or tuple(w for w in BACKENDS if impl.framework in WORLDS[w].frameworks)


def support_text(impl: Impl) -> str:
    """What `normcheck list` says an implementation supports."""
    ranks = get_op(impl.op).ranks
    text = impl.capabilities.replace("every rank the op takes", f"{ranks[0]}-D to {ranks[-1]}-D")
    return f"{', '.join(worlds_of(impl))} worlds; {text}" if get_op(impl.op).distributed else text


def resolve_impl(op: str, spec: str | Impl | Bound | Callable | None = None, backend: str | None = None,
                 timeout: CaseLimit | float | None = None, framework: str | None = None,
                 device: str | None = None, triton_interpret: bool = False, hints: bool = True) -> Bound:
    """A registered name, a `module:attr` / `path/to/file.py:attr` spec, an Impl (or a Bound) or a callable, bound
    to a world: `backend` (the record's own world when None) under `timeout`: seconds per case, a
    CaseLimit, or None (a limit that follows the cases' measured times; normcheck.worlds.limits).
    `framework`: whose contract a function follows (torch's when None; "jax", "tf": the op's array contract).
    `device`: where a torch implementation's case tensors live (cpu when None; cuda, cuda:1, mps, ...).
    `triton_interpret`: its Triton kernels run in Triton's interpreter, in its worker process (bind).
    `hints`: a failing row is judged again under the conventions it did not declare, and says under which it passes
    (engine.hints; False: never, as `--no-hints`).
    A record already bound stays as it is unless one of backend, timeout, device and triton_interpret is given (or
    hints=False, which turns its hints off)."""
    the_op = get_op(op)
    if spec is None:
        spec = the_op.default_impl
    if isinstance(spec, Bound) and backend is None and timeout is None and device is None and not triton_interpret:
        return spec if hints else replace(spec, hints=None)
    if isinstance(spec, (Impl, Bound)):
        impl = spec  # (a Bound is bound again: bind)
    elif callable(spec) or ":" in spec:  # (a module may publish a whole record: user_impl returns it)
        impl = user_impl(op, spec, framework or "torch")
    elif spec in IMPLS[op]:
        impl = IMPLS[op][spec]
    else:
        elsewhere = [other for other, impls in IMPLS.items() if spec in impls]
        where = f" ({spec} is an implementation of {' and '.join(elsewhere)})" if elsewhere else ""
        raise UsageError(f"unknown implementation {spec!r} for {op}{where}; use one of {', '.join(IMPLS[op])} or "
                         "module:attr")
    if framework is not None and impl.framework != framework:
        raise UsageError(f"--framework {framework}: {impl.name} is a {FRAMEWORKS.title(impl.framework)} implementation")
    return bind(impl, backend, timeout, device, triton_interpret, hints)


def user_impl(op: str, target: str | Callable, framework: str = "torch") -> Impl:
    """A user's function (or `module:attr` spec) under the op's contract for `framework`, checked now, in this
    process (loading it imports what it imports: a JAX function's module imports JAX here too); or the record a
    module publishes under that name.

    Ranks in other processes load a function by name, so for a distributed op it must be importable."""
    the_op = get_op(op)
    why = FRAMEWORKS.missing(framework)
    if why:
        raise UsageError(why)
    kind = FRAMEWORKS.contract(framework)
    signature, _ = the_op.contract(kind)
    code = load_code(target, signature, by_name=the_op.distributed)  # (read once: what follows reads the record)
    if isinstance(code.obj, Impl):
        if code.obj.op != op:
            raise UsageError(f"--impl {code.name} is an implementation of {code.obj.op}, not {op}")
        return code.obj
    if not callable(code.obj):
        raise UsageError(f"--impl {code.name}: {code.name.rpartition(':')[2]} is a {type(code.obj).__name__}, not "
                         "callable")
    if not isinstance(target, str):
        target = code.spec if the_op.distributed else code.obj
    if framework == "torch" and layer_given(code):
        target = layer(the_op, code)
    elif code.misfit:
        raise UsageError(code.misfit)
    # A contract that adds an argument in eval mode (SyncBN's training=False): a function without it has no
    # eval mode, and its eval cases are SKIP rows saying so
    eval_mode = kind == "direct" or the_op.eval_keyword is None or the_op.eval_keyword in code.keywords
    arrays = {} if framework == "torch" else {"formats": formats_of(the_op)}
    return Impl(code.name, op, f"user implementation {code.name}", target, capabilities="unknown (user code)",
                convention="direct" if kind == "direct" else "contract",
                modes=("train", "eval") if eval_mode else ("train",), framework=framework, **arrays)


def layer_given(code: Code) -> bool:
    """What `code` holds is a layer's class, or a factory of configured layers (a function that does not fit the
    contract and takes what constructors take); else a function under the contract."""
    if is_layer_class(code.obj):
        return True
    if is_layer_instance(code.obj):
        kind = type(code.obj)
        raise UsageError(f"--impl {code.name} is a {kind.__name__} already built, whose sizes are fixed: give its class "
                         f"({kind.__module__}:{kind.__qualname__}) or a function returning a configured module, "
                         "and normcheck builds one per case")
    if code.misfit is None:
        return False
    if is_factory(code.obj):
        return True
    raise UsageError(code.misfit)


def layer(op, code: Code) -> Layer:
    """A layer class or factory as a function under `op`'s contract (frameworks.torch.layers.Layer), built in the
    process that runs it: from its spec where it has one (a file's module is importable by path only)."""
    if op.distributed:
        raise UsageError(f"{code.name}: a layer given by its class or factory is judged for single-process ops; for "
                         f"{op.name} give a function under its contract ({op.signature.split(' -> ')[0]})")
    arguments = code.arguments  # (a layer is torch's: the arguments of op.signature)
    return Layer(code.obj if code.spec is None else code.spec, arguments.positional, code.name, arguments.optional,
                 op.layer_switches)


def bind(impl: Impl | Bound, backend: str | None = None, timeout: CaseLimit | float | None = None,
         device: str | None = None, triton_interpret: bool = False, hints: bool = True,
         values_only: bool = False) -> Bound:
    """The record bound (ops.core.Bound): its world chosen, its time limit, its device (`device`: see resolve_impl) and
    its runner: runner(case, inputs, runs=1) -> worlds.core.Run (outputs, path, ops, and what a later run changed).
    `triton_interpret`: its worker process runs Triton's interpreter, and the cases that cannot run there are SKIP rows
    (its `supports`). `hints`: it gets a hint search of its own (Bound.hints), which the bindings made from it share.
    `values_only`: a witness's binding for a failure of values, whose outputs' dtypes are not checked
    (Bound.values_only).
    A Bound is bound again from its record, in the world it was bound to unless `backend` says otherwise."""
    if isinstance(impl, Bound):
        backend, impl = backend or impl.world, impl.impl
    op = get_op(impl.op)
    why = FRAMEWORKS.missing(impl.framework)
    if why:
        raise UsageError(why)
    world = get_world(backend or impl.world or default_world(op.distributed, impl.framework, op.world))
    if world.distributed != op.distributed:
        raise UsageError(f"{op.name} runs in {'a distributed world' if op.distributed else 'one process'}, "
                         f"not the {world.name} world")
    if impl.framework not in world.frameworks:
        raise UsageError(f"the {world.name} world runs {' and '.join(map(FRAMEWORKS.title, world.frameworks))} "
                         f"implementations; {impl.name} is a {FRAMEWORKS.title(impl.framework)} one "
                         f"(its worlds: {', '.join(worlds_of(impl))})")
    limit = as_limit(timeout)
    device = device_of(impl, world, device)
    supports = Interpreted(impl.supports) if triton_interpret else impl.supports
    bound = Bound(impl, world.name, limit=limit, device=device, supports=supports, triton_interpret=triton_interpret,
                  values_only=values_only)
    # A worker process (the isolated world's, a devices world's) rebuilds the record; gloo ranks load the function
    bound = replace(bound, portable=portable(bound) if world.ranks in ("worker", "devices", "process") else None)
    if triton_interpret:
        check_interpretable(bound, world)

    def runner(case, inputs, runs: int = 1):
        world.check(case)
        return world.run(bound, case, inputs, limit, runs)

    own_record = (impl.op, impl.name) in _BUILT_IN
    # torch's records run as witnesses under a limit of their own: their times say nothing of this implementation's
    return replace(bound, runner=runner,
                   witness=None if own_record else partial(witness, CaseLimit(limit.fixed), {}, device),
                   hints=HintSearch() if hints else None)  # (a run's own: its budget, what explained its rows)


def device_of(impl: Impl, world, device: str | None) -> str:
    """The device a bound implementation's tensors live on: `device` (cpu when None) for a single-process op's torch
    implementation; a distributed world's own. One-line UsageError for a device this torch lacks, or one the
    implementation's framework or world does not take."""
    if device is None or device == "cpu":
        return world.device if world.distributed else "cpu"
    why = device_missing(device)
    if why:
        raise UsageError(f"--device {device}: {why}")
    if impl.framework != "torch":
        raise UsageError(f"--device {device}: {impl.name} is a {FRAMEWORKS.title(impl.framework)} implementation; "
                         "--device places torch implementations' tensors")
    if world.distributed and device != world.device:
        raise UsageError(f"--device {device}: the {world.name} world runs its ranks on {world.device}; --device "
                         f"applies to single-process ops (lockstep-cuda runs {impl.op} on CUDA)")
    return device


def check_interpretable(bound: Bound, world) -> None:
    """One-line UsageError unless the `bound` implementation runs in a worker process of its own that can take
    Triton's interpreter: a torch implementation in the isolated world that pickles (the variable must be set before
    its module is imported, so never in this process)."""
    why = interpreter_missing()
    if why:
        raise UsageError(why)
    if bound.framework != "torch":
        raise UsageError(f"--triton-interpret: {bound.name} is a {FRAMEWORKS.title(bound.framework)} implementation; "
                         "Triton kernels are torch code")
    if world.ranks != "worker":
        raise UsageError(f"--triton-interpret runs a single-process op's implementation in the isolated world's worker "
                         f"process, not {'the ranks of ' if world.distributed else ''}the {world.name} world")
    if bound.portable is None:
        raise UsageError(f"--triton-interpret: {bound.name} does not pickle (a lambda, or a function defined inside "
                         "another), so it would run in this process; the interpreter runs only in a worker process "
                         "(define it at module level)")


def witness(limit: CaseLimit, bound: dict, device: str, issue, case, values_only: bool = False) -> Bound | None:
    """torch's own record that `issue` is recorded on and that takes `case`, bound once per binding (`bound`, under
    `limit`: the witnesses' own) in its default world on the binding's `device`: its outputs on the case tell whether a
    failure of code that calls torch's kernel is torch's. `values_only`: bound so (Bound.values_only), for a failure
    of values."""
    for record in IMPLS.get(case.op, {}).values():
        if issue in record.known_issues and (record.op, record.name) in _BUILT_IN:
            key = record.name, values_only
            if key not in bound:
                bound[key] = bind(record, timeout=limit, device=None if device == "cpu" else device, hints=False,
                                  values_only=values_only)
            if bound[key].unsupported(case) is None:
                return bound[key]
    return None


def portable(bound: Bound) -> Callable[[], Bound] | None:
    """How a worker process gets this bound record (the record, its device): a built-in by name, anything else as the
    record itself (without what only this process reads: its known issues and support rule) when it pickles;
    None when it cannot travel (a lambda, a function defined inside another)."""
    impl = bound.impl
    key = (impl.op, impl.name)
    if key in _BUILT_IN and _BUILT_IN[key] == replace(impl, world=_BUILT_IN[key].world):
        return partial(built_in, *key, bound.world, bound.device, bound.triton_interpret, bound.values_only)
    target = absolute_spec(impl.target) if isinstance(impl.target, str) else impl.target
    travelling = replace(bound, impl=replace(impl, target=target, known_issues=(), supports=supports_everything,
                                             world=None), supports=supports_everything, limit=None)
    try:
        pickle.dumps(travelling)
    except Exception:  # noqa: BLE001 - pickling fails in many ways; any of them means "run here"
        return None
    return partial(_itself, travelling)


def built_in(op: str, name: str, world: str, device: str = "cpu", triton_interpret: bool = False,
             values_only: bool = False) -> Bound:
    """A built-in record bound in a worker process (by name: every process that imports normcheck has it)."""
    return Bound(_BUILT_IN[(op, name)], world, device=device, triton_interpret=triton_interpret,
                 values_only=values_only)


def _itself(bound: Bound) -> Bound:
    return bound


def backend_of(bound: Bound) -> str | None:
    """The world a bound implementation of a distributed op runs in (None for single-process ops):
    replay lines name it so they replay the same world."""
    return bound.world if get_op(bound.op).distributed else None


def check_world(bound: Bound, case) -> None:
    """One-line UsageError when `case` cannot run in the bound implementation's world."""
    get_world(bound.world).check(case)
