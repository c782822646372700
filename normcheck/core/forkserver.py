"""The fork server every worker process forks from (the isolated world's and the gloo world's), and
starting it early.

The server imports torch once; a worker then forks from it in ~0.1 s. Started at the top of a CLI
run that will need workers, before this process imports torch itself, the two imports overlap
(~2 s of wall time on 2 cores). A leaf: importing it imports neither torch nor the rest of normcheck.
"""
from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading

from .orphans import PARENT

# What torch imports lazily on a process's first case, preloaded so no fresh worker pays it inside
# the case's time limit (2 cores: symbolic_shapes, through suggest_memory_format, ~0.4-1 s; _dynamo,
# through Tensor.detach's compile guard, ~1.3 s). core.orphans first: the server dies with normcheck from then on.
PRELOAD = ["normcheck.core.orphans", "torch", "torch.distributed", "torch.fx.experimental.symbolic_shapes", "torch._dynamo",
           "normcheck.worlds.workers"]


# OpenMP's threads (torch's intra-op pool) spin for a while after each parallel region by default, and NumPy's
# OpenBLAS starts a thread per core: where a run and its worker processes share a few cores, the spinning takes the
# cores the other processes need (a CLI sweep of LayerNorm on 2 cores: 24.1 s, 16.2 s with both set; the gate's two
# workers: the same tests took 49 s side by side against 26 s with passive waits). Neither changes a thread count
# torch computes with, and so no kernel path; one BLAS thread moves the float64 reference's last bits only. Set
# before torch or NumPy is loaded (here: before the server starts, for every worker); a user's own setting wins.
QUIET_THREADS = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_NUM_THREADS": "1"}


def quiet_threads() -> None:
    """Set QUIET_THREADS in this process's environment (and so its children's), where the user has not."""
    for name, value in QUIET_THREADS.items():
        os.environ.setdefault(name, value)


def context():
    """'forkserver' with torch and normcheck preloaded, its server started. The server itself is
    single-threaded, so forking it is safe (no fork of a threaded parent)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    _start()
    return ctx


def _start() -> None:
    """Start the server (once: a running one is kept) and stop it when this process exits. SIGINT is ignored while
    it starts (the few milliseconds of a fork and exec, and blocked: one that arrives then is this process's once
    the server is started): an ignored signal stays ignored through exec, so a Ctrl-C,
    which a terminal sends the whole process group, never interrupts the server's start-up or its imports, whose
    tracebacks it printed under the run's one line. The workers forked from it ignore it too: the parent handles
    it and stops them."""
    from multiprocessing import forkserver, resource_tracker

    quiet_threads()
    if not _STOP_REGISTERED:
        atexit.register(stop)
        _STOP_REGISTERED.append(True)
    main_thread = threading.current_thread() is threading.main_thread()
    # (blocked as well as ignored: Linux keeps a blocked signal pending whatever its handler, so a Ctrl-C in this
    # window reaches this process's own handler once it is unblocked, instead of being lost. The resource tracker
    # starts first: starting it unblocks SIGINT, which inside the window let a Ctrl-C meet the ignoring handler)
    resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if main_thread else None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    os.environ[PARENT] = str(os.getpid()) + ("" if main_thread else " unarmed")  # (core.orphans.arm_server reads it)
    try:
        with main_hidden():
            forkserver.ensure_running()
    finally:
        os.environ.pop(PARENT, None)
        if main_thread:
            signal.signal(signal.SIGINT, previous)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


_STOP_REGISTERED: list[bool] = []


def stop() -> None:
    """End the fork server now. It would end by itself once it sees this process gone, but only from its loop: one
    still importing torch (a run that ended in its first second: a usage error, Ctrl-C, SIGTERM) lived on for its
    whole import, 20-100 s on a loaded machine. It holds nothing but preloaded modules. (A SIGKILLed normcheck runs
none of this: the server then ends by itself, core.orphans.)"""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # (our child: reaped, not left a zombie)


@contextlib.contextmanager
def main_hidden():
    """Start processes without the parent's main script: multiprocessing would import it in the
    fork server and in each worker, and a script without the `if __name__ == "__main__":` guard
    would run again there. Nothing a worker runs comes from it (jobs name importable modules)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    if saved:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
    try:
        yield
    finally:
        if saved:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def start_early() -> None:
    """Start the server now; it preloads while this process goes on (the first worker waits for it)."""
    context()
