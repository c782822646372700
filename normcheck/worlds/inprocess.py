"""The single-process ops' worlds.

* isolated   — the implementation runs in a worker process of its own (normcheck.worlds.workers):
  one that hangs is stopped at the case's time limit, one that kills its process (os._exit, a
  segfault, an abort in C++) is reported with its exit code or signal, and the run goes on in a
  fresh worker. An implementation that cannot reach another process (a lambda, a function defined
  inside another: it does not pickle) runs in this process instead, without that protection. One pool per
  worker setup: an implementation bound with --triton-interpret gets workers of its own, which switch Triton's
  interpreter on before they import it, and no other implementation runs there.
* in-process — this process (for a debugger, or code that must share this process's state).
"""
from __future__ import annotations

from ..core.errors import CaseTimeout, ImplError, NotDifferentiable, RaisedElsewhere, Unsupported, UsageError
from ..frameworks import run_case
from ..frameworks.torch.triton import interpret_here
from .core import Run, differing, repeated
from .limits import CaseLimit
from .workers import WorkerPool

# Why a case past its limit in Triton's interpreter is no verdict on the kernel
INTERPRETER_TIMEOUT = ("Triton's interpreter runs a grid's programs one after another in Python, hundreds of times "
                       "slower than a GPU, so a slow case (or programs that wait for one another) says nothing of the "
                       "kernel there; judge it on a GPU (--device cuda) or give --timeout S")
_POOLS: dict[object, WorkerPool] = {}  # what its workers run first (None: nothing) -> the pool


def run_here(bound, case, inputs, limit: CaseLimit, runs: int = 1) -> Run:
    """The in-process world's run of a bound implementation (the limit measures the case; nothing here can stop
    it)."""
    if bound.impl.prepare is not None:
        bound.impl.prepare()  # outside the case's time (idempotent: a build is cached)
    return repeated(lambda: limit.run(case, lambda timeout: run_case(bound, case, inputs)), runs)


def run_isolated(bound, case, inputs, limit: CaseLimit, runs: int = 1) -> Run:
    """The isolated world's run: the case in the worker process, its outcome re-raised here. A case run more than once
    runs again on the inputs the worker kept, which answers with the outputs whose bits changed: inputs and outputs
    cross between the processes once (each run under the case's limit, as when they crossed every time)."""
    if bound.portable is None:
        return run_here(bound, case, inputs, limit, runs)

    def once():
        return _in_worker(bound, case, ("solo", bound.portable, inputs, runs > 1), limit)

    def again(first):
        differ = _in_worker(bound, case, ("again",), limit)
        return differ if differ is not None else differing(first, once()[0])  # (a worker that kept no case)

    return repeated(once, runs, again)


def _in_worker(bound, case, job, limit: CaseLimit):
    """A job's outcome in the isolated worker process: its result, or how it failed raised here."""
    try:
        pool = _pool(interpret_here if bound.triton_interpret else None)
        [outcome] = pool.run_job(case, job, limit, load=("load", bound.portable))
    except ImplError as e:  # a one-process pool names its only rank: a single process needs no name
        message = str(e).removeprefix("rank 0: ")
        if isinstance(e, CaseTimeout) and bound.triton_interpret:  # (the worker restarts as after any timeout)
            raise Unsupported(f"{message}: {INTERPRETER_TIMEOUT}") from None
        error = CaseTimeout(message, e.seconds, e.unstarted) if isinstance(e, CaseTimeout) else type(e)(message)
        if hasattr(e, "ops_called"):  # (the kernels it had called when it died or hung)
            error.ops_called = e.ops_called
        raise error from None
    kind, *details = outcome
    if kind in ("outputs", "differ"):
        return details[0]
    if kind == "usage":
        raise UsageError(details[0])
    if kind == "unsupported":  # (it declined the case: its message is the SKIP row's reason)
        message, not_differentiable, takes, declines = details
        raise (NotDifferentiable if not_differentiable else Unsupported)(message, takes, declines)
    if kind in ("raised", "impl"):  # (an ImplError of the interface checks keeps its message as it is)
        raise RaisedElsewhere(*details)
    raise ImplError(details[0])


def _pool(setup) -> WorkerPool:
    pool = _POOLS.get(setup)
    if pool is None or pool.closed:
        pool = _POOLS[setup] = WorkerPool(1, group=False, name="isolated", setup=setup)
        pool.kind = "isolated worker process"
    return pool
