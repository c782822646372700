"""The implementation catalogue: every Impl record, and binding a record to the world it runs in.

One table (`IMPLS`, op -> name -> Impl) holds them all: torch's own from the op records, normcheck's
same-precision baseline, our GroupNorm kernel (and torch's beside it at fixed thread counts), the
SyncBN recipes, and whatever users `register`. `resolve_impl` turns a name, a `module:attr` spec,
a function or a record into a bound record (its `runner` set), which the engine judges.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..core.errors import UsageError
from ..core.loading import check_arity, load_callable, spec_of
from ..engine.baseline import baseline_outputs
from ..kernels.groupnorm.impls import IMPLS as GROUPNORM_KERNEL_IMPLS
from ..kernels.syncbn.recipes import IMPLS as SYNCBN_RECIPES
from ..ops import OPS, Impl, get_op
from ..worlds import BACKENDS, DEFAULT_TIMEOUT, get_world

BASELINES = tuple(
    Impl("baseline", op.name, "normcheck's same-precision baseline (float32 accumulation)", baseline_outputs,
         convention="direct", framework="numpy")
    for op in OPS.values() if not op.distributed
)

IMPLS: dict[str, dict[str, Impl]] = {name: {} for name in OPS}


def register(impl: Impl) -> Impl:
    get_op(impl.op)
    IMPLS[impl.op][impl.name] = impl
    return impl


for _impl in (*(i for op in OPS.values() for i in op.impls), *BASELINES, *SYNCBN_RECIPES, *GROUPNORM_KERNEL_IMPLS):
    register(_impl)


def list_impls(op: str) -> list[Impl]:
    get_op(op)
    return list(IMPLS[op].values())


def worlds_of(impl: Impl) -> tuple[str, ...]:
    """The worlds an implementation can run in."""
    if not get_op(impl.op).distributed:
        return ("in-process",)
    return impl.worlds or BACKENDS


def support_text(impl: Impl) -> str:
    """What `normcheck list` says an implementation supports."""
    if get_op(impl.op).distributed:
        return f"{', '.join(worlds_of(impl))} worlds; {impl.capabilities}"
    return impl.capabilities


def resolve_impl(op: str, spec: str | Impl | Callable | None = None, backend: str | None = None,
                 timeout: float | None = None) -> Impl:
    """A registered name, a `module:attr` / `path/to/file.py:attr` spec, an Impl or a callable, bound
    to a world: `backend` (the record's own world when None) with `timeout` seconds per case (the
    worlds' default when None). A record already bound stays as it is unless either is given."""
    the_op = get_op(op)
    if spec is None:
        spec = the_op.default_impl
    if isinstance(spec, Impl):
        if spec.runner is not None and backend is None and timeout is None:
            return spec
        impl = spec
    elif callable(spec):
        impl = user_impl(op, spec)
    elif spec in IMPLS[op]:
        impl = IMPLS[op][spec]
    elif ":" not in spec:
        raise UsageError(f"unknown implementation {spec!r} for {op}; use one of {', '.join(IMPLS[op])} or module:attr")
    else:
        impl = user_impl(op, spec)
    return bind(impl, backend, DEFAULT_TIMEOUT if timeout is None else timeout)


def user_impl(op: str, target: str | Callable) -> Impl:
    """A user's function (or `module:attr` spec) under the op's contract, checked now, in this process.

    Ranks in other processes load a function by name, so for a distributed op it must be importable."""
    the_op = get_op(op)
    if callable(target):
        fn = target
        name = spec_of(fn) if the_op.distributed else getattr(fn, "__qualname__", repr(fn))
        target = name if the_op.distributed else fn
    else:
        fn, name = load_callable(target), target
    check_arity(name, fn, the_op.signature)
    return Impl(name, op, f"user implementation {name}", target, capabilities="unknown (user code)")


def bind(impl: Impl, backend: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Impl:
    """The record with its world chosen and its runner set: runner(case, inputs) -> (outputs, path, ops)."""
    op = get_op(impl.op)
    world = get_world(backend or impl.world or op.world)
    if world.distributed != op.distributed:
        raise UsageError(f"{op.name} runs in {'a distributed world' if op.distributed else 'one process'}, "
                         f"not the {world.name} world")
    bound = replace(impl, world=world.name, runner=None)

    def runner(case, inputs):
        world.check(case)
        return world.run(bound, case, inputs, timeout)

    return replace(bound, runner=runner)


def backend_of(impl: Impl) -> str | None:
    """The world a bound implementation of a distributed op runs in (None for single-process ops):
    replay lines name it so they replay the same world."""
    return impl.world if get_op(impl.op).distributed else None


def check_world(impl: Impl, case) -> None:
    """One-line UsageError when `case` cannot run in the bound implementation's world."""
    get_world(impl.world).check(case)
