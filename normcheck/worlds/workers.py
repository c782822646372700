"""Persistent worker processes that serve cases: the gloo world's ranks, and the single process an
isolated implementation runs in.

Design
------
* Workers are ``multiprocessing`` 'forkserver' processes (no fork of a threaded parent): the fork
  server imports torch and normcheck once, each worker forks from it (~0.1 s), joins the gloo
  process group if it is a rank, and then serves cases until closed.
  The parent sends ``(case, job)``: a rank makes the case's inputs itself (deterministic) and runs
  ``normcheck.frameworks.torch.run_rank``; a single-process job carries its inputs and a picklable
  way to rebuild the implementation record. Outputs come back by plain ``pickle``, arrays out of
  band in frames of their own (no shared memory or file descriptors travel).
* Rendezvous (ranks): the parent hosts the ``TCPStore``, bound to port 0, so the OS picks a free
  port and the parent keeps it bound for the pool's life: two pools (or two test runs) on one
  machine can never collide, and there is no gap between choosing a port and binding it. Start-up
  is still retried when a worker reports "address in use".
* Failures: a worker that raises, returns bad outputs, dies or runs past the case's time limit
  fails the case with an ``ImplError`` naming the rank(s) and the cause. Peers that merely failed or
  waited in a collective because of it are not blamed: on a timeout each worker's control thread
  reports where its main thread is (in a torch.distributed collective, or in which user frame).
  When some ranks have finished while the others wait in a collective nobody can join any more,
  the case ends at once (a deadlock). After any failure the workers' state is unknown, so every
  worker is killed (SIGKILL) and the next case starts fresh ones.
* Nothing is left behind: ``close()`` asks workers to exit, then kills what is left, each worker's process group
  included (what an implementation started: ``core.orphans``); a finaliser does the same when a pool is
  garbage-collected or the interpreter exits; workers are daemonic and exit on their own when the parent disappears
  (their control pipe closes), and die with the fork server, which dies with normcheck, a SIGKILLed one too.
* gloo's own collective timeout is set well above the per-case limit, so the parent's limit
  (which kills the stuck workers) always decides first.
* Workers never import the parent's main script (a script without the ``__main__`` guard is
  fine); a function defined there cannot reach them, so it runs in the parent (single-process
  ops) or is refused (ranks).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import functools
import os
import pickle
import signal
import struct
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait as _wait_any

from ..cases import Case
from ..core.errors import CaseTimeout, ImplError, NotDifferentiable, SetupError, Unsupported, UsageError
from ..core.forkserver import context, main_hidden
from ..core.loading import load_callable
from ..core.machine import case_memory
from ..core.orphans import arm_worker, kill_group
from ..core.text import clip, exception_text, raised_at, rank_list
from ..frameworks import FRAMEWORKS, run_case
from ..frameworks.torch import run_rank
from ..frameworks.torch.adapter import OpRecorder
from ..kernels.syncbn import cpu_primitives
from . import printed
from .core import RankOutputs, differing
from .failures import UNSUPPORTED, _torch_dirs, collective_of, declined, describe_failures, exit_text, failure_of
from .failures import limit_memory, memory_failure, never_joined
from .limits import DEFAULT_TIMEOUT, LOOK_AGAIN, CaseLimit, as_limit, positive_seconds

STARTUP_TIMEOUT = 180.0       # all ranks imported torch and joined the group (8 ranks on 2 cores: ~15 s)
_HOST = "127.0.0.1"
_FAILURE_GRACE = 0.25         # after one rank fails, how long the others get to report before the kill
_DEADLOCK_GRACE = 0.2         # after one rank finished, when to look whether the others are stuck in a collective
_DEADLOCK_POLL = 0.2          # and how often after that (a deadlock is two identical looks in a row)
_WHERE_BUDGET = 1.0           # how long the parent waits for "where is your main thread" answers
_NOWHERE = (None, None, False, True)  # a rank that gave none: (collective, location, starting, begun), _describe_stack's
_EXIT_GRACE = 3.0             # close(): how long workers get to exit on their own before SIGKILL
_START_ATTEMPTS = 3


class WorldStartError(RuntimeError):
    """The world's worker processes could not be started (not the implementation's fault)."""


# ----------------------------------------------------------------------------- wire format
# A message is one or more frames: the pickle, its arrays' bytes following out of band (pickle protocol 5), each
# written from the array's own memory and read into a buffer the unpickled array keeps: a case's inputs and outputs
# (tens of MB for a large case) are not copied into and out of one pickled string on each side, which took most of
# an isolated run's time on large cases. The first frame leads with the count and sizes of the frames after it.
_HEAD = struct.Struct("<I")


def _frames(obj) -> list:
    # Plain pickle, not the multiprocessing pickler: torch registers shared-memory reductions for
    # tensors there, which would move outputs into shared memory and pass file descriptors.
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
    return [_HEAD.pack(len(raws)) + sizes + data, *raws]


def _send_frames(conn, frames: list) -> None:
    for frame in frames:
        conn.send_bytes(frame)


def _send(conn, obj) -> None:
    _send_frames(conn, _frames(obj))


def _recv(conn):
    first = conn.recv_bytes()
    (count,) = _HEAD.unpack_from(first)
    sizes_format = f"<{count}Q"
    sizes = struct.unpack_from(sizes_format, first, _HEAD.size)
    buffers = []
    for size in sizes:  # (writable buffers: the arrays unpickled on them are writable, as before)
        buffer = bytearray(size)
        if size:
            conn.recv_bytes_into(buffer)
        else:
            conn.recv_bytes()
        buffers.append(buffer)
    return pickle.loads(memoryview(first)[_HEAD.size + struct.calcsize(sizes_format):], buffers=buffers)


# ----------------------------------------------------------------------------- messages
def _last_line(path: str) -> str:
    """The last non-empty line a worker wrote to stderr (trimmed), or ''."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
    except OSError:
        return ""
    return clip(lines[-1], 200) if lines else ""


def _journal_path(stderr_path: str) -> str:
    """Where a worker writes the names of the aten ops its current case dispatched (OpRecorder.journal)."""
    return stderr_path.removesuffix(".stderr") + ".ops"


def _journal(stderr_path: str) -> frozenset[str]:
    """The aten ops a worker's current case dispatched, as far as its journal says (empty: none, or unreadable)."""
    try:
        with open(_journal_path(stderr_path)) as f:
            return frozenset(line.strip() for line in f if line.strip())
    except OSError:
        return frozenset()


# ----------------------------------------------------------------------------- worker side
# normcheck's code that stands between a case and the implementation (not its own recipes and kernels, which are
# implementations): a frame there is never the line a failure names
_MACHINERY = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
                   for d in ("frameworks", "worlds", "engine", "core"))


# Where a case is starting up, not running: importing, compiling or tracing (torch.compile, TorchScript, a C++
# extension built on first use, Triton, XLA, tf.function), or waiting for a child process (a compiler, a build tool)
_STARTING_UP = ("<frozen importlib", "importlib/", "subprocess.py", "torch/_dynamo/", "torch/_inductor/",
                "torch/_functorch/", "torch/jit/", "torch/utils/cpp_extension.py", "triton/compiler/",
                "triton/runtime/build.py", "jax/_src/compiler.py", "jax/_src/interpreters/",
                "tensorflow/python/eager/polymorphic_function/", "tensorflow/python/framework/func_graph.py",
                "numba/core/")


def _describe_stack(frame) -> tuple[str | None, str | None, bool, bool]:
    """(collective, location, starting, begun) of a thread's current stack: the torch.distributed call it waits in,
    its innermost frame outside torch, the standard library and normcheck's own machinery (the adapter's
    function mode, the worlds): the implementation's line ("file.py:12 in fn"), whether it is starting up
    (_STARTING_UP), and whether it has begun a job at all (not still reading a message in)."""
    if frame is None:
        return _NOWHERE
    stack = traceback.extract_stack(frame)
    starting = any(marker in f.filename.replace(os.sep, "/") for f in stack for marker in _STARTING_UP)
    # (the frames under the job are the worker's own loop and its bootstrap, "<string>:1": never the place to name)
    job = next((i for i, f in enumerate(stack) if f.name == _run_job.__name__ and f.filename == __file__), None)
    if job is None:  # still reading a message in (or not in a worker)
        return collective_of(stack), None, starting, False
    stack = stack[job:]
    torch_dir, _ = _torch_dirs()
    stdlib = {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")}
    outside = [f for f in stack if not f.filename.startswith(torch_dir)
               and not any(f.filename.startswith(s) for s in stdlib)]
    theirs = [f for f in outside if not f.filename.startswith(_MACHINERY)]
    loc = (theirs or outside or stack)[-1] if stack else None
    where = f"{os.path.basename(loc.filename)}:{loc.lineno} in {loc.name}" if loc else None
    return collective_of(stack), where, starting, True


def _control_loop(ctrl, main_ident: int) -> None:
    """Answer "where" while the main thread may be stuck; exit when the parent goes away."""
    while True:
        try:
            msg = _recv(ctrl)
            if msg == "where":
                _send(ctrl, _describe_stack(sys._current_frames().get(main_ident)))
        except (EOFError, OSError):
            os._exit(70)  # the parent closed our pipe or died: nobody will ever read our results


_KEPT = "the case kept to run again"  # (a key of _run_job's `fns`, beside the implementations' specs)


def _run_job(job, case, rank: int, group, size: int, fns: dict, budget: int | None = None):
    """One message's work. ("load", spec or portable): import the implementation and run its
    `prepare` (a C++ build, say) before its first case in this process, outside any case's limit;
    ("rank", spec): this rank's part of a distributed case (every rank makes the case's inputs
    itself); ("solo", portable, inputs, keep): a single-process implementation under its framework adapter, its
    outcome (outputs, or how it failed) returned as data, the case kept (`keep`) for ("again",): the kept case run
    once more on its inputs, the outputs whose bits changed returned (None when none was kept)."""
    if job[0] == "load":
        what = job[1]
        if isinstance(what, str):
            fns[what] = load_callable(what)
        else:
            impl = what().impl  # (the record, rebuilt here: impls.catalogue.portable)
            FRAMEWORKS[impl.framework]  # the framework's own import (JAX's, TensorFlow's: seconds), not a case's
            impl.callable()
            try:
                if impl.prepare is not None:
                    impl.prepare()
            except SetupError as e:  # (normcheck's own setup: the run's error, not the implementation's failure)
                return ("setup", str(e))
        return None
    if job[0] == "rank":
        spec = job[1]
        fn = fns.get(spec)
        if fn is None:
            fn = fns[spec] = load_callable(spec)
        return run_rank(case.record, fn, case, case.make_inputs(), rank, group, size)
    kept = fns.pop(_KEPT, None)  # (a kept case serves the job right after it, and nothing is held longer)
    try:
        if job[0] == "again":
            if kept is None:
                return ("differ", None)
            bound, inputs, first = kept
            fns[_KEPT] = kept
            return ("differ", differing(first, run_case(bound, case, inputs)[0]))
        _, portable, inputs, keep = job
        bound = portable()  # (the bound record, rebuilt here: its device)
        result = run_case(bound, case, inputs)
        if keep:
            fns[_KEPT] = (bound, inputs, result[0])
        return ("outputs", result)
    except UsageError as e:
        return ("usage", str(e))
    except Unsupported as e:  # a SKIP, not a failure (NotDifferentiable is an ImplError too)
        return ("unsupported", str(e), isinstance(e, NotDifferentiable), e.takes, e.declines)
    except ImplError as e:
        return ("impl", str(e), "", _ops_called(e))
    except BaseException as e:  # noqa: BLE001 - SystemExit from an implementation is a failure too
        if memory := memory_failure(e, budget):  # (an allocation past the case's limit: a SKIP row naming memory)
            return ("unsupported", memory, False, {}, {})
        return ("raised", exception_text(e) + raised_at(e), "".join(traceback.format_exception(e)), _ops_called(e))


def _ops_called(e: BaseException) -> tuple[str, ...]:
    """The kernels the implementation ran before it raised (the torch adapter records them)."""
    return tuple(sorted(getattr(e, "ops_called", ())))


def _worker_main(rank: int, size: int, port: int | None, gloo_timeout: float, conn, ctrl, stderr_path: str,
                 setup: Callable[[], None] | None = None) -> None:
    """A worker: run `setup`, join the gloo process group on `port` (None: a single-process worker, no group),
    then serve (seq, case, job, parent's sys.path) messages until told to stop."""
    arm_worker()  # its own process group (its children's), and SIGKILL when the fork server dies: core.orphans
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    # What a worker prints (an implementation's debug output, a dying worker's C++ abort message) goes to a file the
    # parent quotes in its failure message, instead of interleaving with the report (or a JSON document) on stdout.
    try:
        printed = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:  # (the parent stopped, a Ctrl-C, and took its directory before this worker started: it serves none)
        return
    os.dup2(printed, 2)
    os.dup2(printed, 1)
    try:
        journal = os.open(_journal_path(stderr_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    except OSError:  # (as for stderr: the parent stopped and took its directory)
        return
    OpRecorder.journal = journal
    group = None
    try:
        if setup is not None:  # before the first message: unpickling a job may import the implementation's module
            setup()
        import torch
        import torch.distributed as dist

        threading.Thread(target=_control_loop, args=(ctrl, threading.get_ident()), daemon=True,
                         name="normcheck-control").start()
        if port is not None:
            torch.set_num_threads(1)  # W ranks share the machine's cores
            cpu_primitives.register()  # torch's SyncBN primitives get CPU kernels in this process only
            timeout = datetime.timedelta(seconds=gloo_timeout)
            store = dist.TCPStore(_HOST, port, size, False, timeout=timeout)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
            dist.barrier()  # every pair connected before the first case
            group = dist.group.WORLD
    except BaseException as e:  # noqa: BLE001 - report start-up failures to the parent
        _send(conn, ("failed", exception_text(e)))
        return
    _send(conn, ("ready", os.getpid()))
    fns: dict[str, Callable] = {}
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            break
        if msg is None:
            break
        seq, case, job, (parent_path, parent_cwd), budget = msg
        # `module:attr`, files and pickled functions resolve as in the parent
        if sys.path != parent_path:
            sys.path[:] = parent_path
        if os.getcwd() != parent_cwd:
            with contextlib.suppress(OSError):
                os.chdir(parent_cwd)
        os.ftruncate(journal, 0)  # (the kernels this case calls, each written as it is first dispatched)
        limit_memory(None if job[0] == "load" else budget)  # (importing and building are not a case's)
        try:
            reply = (seq, "ok", _run_job(job, case, rank, group, size, fns, budget))
        except BaseException as e:  # noqa: BLE001 - SystemExit from an implementation is a failure too
            memory = memory_failure(e, budget)
            reply = (seq, "failed", (UNSUPPORTED, memory, None) if memory else failure_of(e))
        _flush_printed()  # before the reply: the parent reads what the case printed once it has it
        try:
            frames = _frames(reply)
        except Exception as e:  # noqa: BLE001
            frames = _frames((seq, "failed", ("raised", f"outputs cannot be sent back: {exception_text(e)}", None)))
        _send_frames(conn, frames)
    if group is not None:
        dist.destroy_process_group()
    # Run atexit hooks and flush, but skip the interpreter's module teardown (most of a second
    # with torch loaded, times every rank on 2 cores): closing a world stays quick.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _flush_printed() -> None:
    """Write out what the case printed and still sits in a buffer: Python's, and C stdio's (a kernel's printf)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        _libc().fflush(None)


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None)


# ----------------------------------------------------------------------------- parent side
def _kill(procs: list, conns: list, holder: list) -> None:
    """SIGKILL and reap every process and what it started (its process group, which outlives a worker that exited:
    the group's id stays taken while a member lives, so it names no other process); close the pipes; release the
    TCPStore. Idempotent."""
    for p in procs:
        if p.pid is not None:  # started
            kill_group(p.pid)
        if p.is_alive():
            p.kill()
    for p in procs:
        if p.pid is not None:  # started
            p.join(10)
    for c in conns:
        c.close()
    holder.clear()


def _parent_place() -> tuple[list[str], str]:
    """This process's import path and directory, which a worker takes on for each case."""
    cwd = os.getcwd()
    return ([cwd] if cwd not in sys.path else []) + list(sys.path), cwd


def _with_ops(error: ImplError, ops: frozenset[str]) -> ImplError:
    """`error` carrying the aten ops the failed ranks had called (engine.compare: the known issues they may explain)."""
    if ops:
        error.ops_called = ops
    return error


class _StartFailed(Exception):
    pass


class _Workers:
    """One incarnation of a pool: W processes, their pipes, and (joined in a process group) the
    TCPStore they met at."""

    def __init__(self, size: int, gloo_timeout: float, group: bool = True, name: str = "gloo", setup=None):
        import torch.distributed as dist

        self.size = size
        self.gloo_timeout = gloo_timeout
        self.seq = 0
        self.loaded: set[bytes] = set()  # the load jobs these processes have run
        self.port = None
        self._holder = []
        if group:
            store = dist.TCPStore(_HOST, 0, None, True, timeout=datetime.timedelta(seconds=gloo_timeout),
                                  wait_for_workers=False)
            self.port = store.port
            self._holder.append(store)
        ctx = context()
        self.procs: list = []
        self.conns: list = []
        self.ctrls: list = []
        pipes: list = []  # the finaliser gets the lists (filled below), never self
        self._finalizer = weakref.finalize(self, _kill, self.procs, pipes, self._holder)
        # At interpreter exit close_all() stops live worlds gracefully (and multiprocessing then
        # terminates any daemonic child left); this finaliser covers a world garbage-collected unclosed.
        self._finalizer.atexit = False
        self._stderr_dir = tempfile.TemporaryDirectory(prefix="normcheck-gloo-")
        self.stderr_paths = [os.path.join(self._stderr_dir.name, f"rank{r}.stderr") for r in range(size)]
        try:
            for rank in range(size):
                conn, child_conn = ctx.Pipe()
                ctrl, child_ctrl = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, name=f"normcheck-{name}{size}-rank{rank}", daemon=True,
                                   args=(rank, size, self.port, gloo_timeout, child_conn, child_ctrl,
                                         self.stderr_paths[rank], setup))
                self.procs.append(proc)
                self.conns.append(conn)
                self.ctrls.append(ctrl)
                pipes += [conn, ctrl]
                with main_hidden():
                    proc.start()
                child_conn.close()
                child_ctrl.close()
        except BaseException:
            self.kill()
            raise
        self.pids = [p.pid for p in self.procs]

    # -- start-up ---------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = set(range(self.size))
        problems: dict[int, str] = {}
        while waiting and not problems:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _StartFailed(f"{rank_list(waiting)} not ready after {timeout:g} s")
            ready = set(_wait_any([self.conns[r] for r in waiting] + [self.procs[r].sentinel for r in waiting], left))
            for r in sorted(waiting):
                if self.conns[r] in ready or self.procs[r].sentinel in ready:
                    msg = self._read(r)
                    waiting.discard(r)
                    if msg is None:
                        problems[r] = self._death(r)
                    elif msg[0] != "ready":
                        problems[r] = msg[1]
        if problems:
            raise _StartFailed("; ".join(f"rank {r}: {t}" for r, t in sorted(problems.items())))

    # -- one case ---------------------------------------------------------------------------
    def run_case(self, case: Case, job, timeout: float, first_look: float | None = None) -> list:
        """Every rank's outputs of `job` on `case` within `timeout` seconds; at `first_look` seconds (and every
        LOOK_AGAIN after), a case still running gets the rest of its time only while it is starting up."""
        if job[0] == "load":  # (what importing the implementation prints is not a case's)
            return self._run_case(case, job, timeout, first_look)
        since = printed.offsets(self.stderr_paths)
        try:
            return self._run_case(case, job, timeout, first_look)
        finally:  # (a case that failed, timed out or killed its worker printed what it printed too)
            printed.keep(self.stderr_paths, since)

    def _run_case(self, case: Case, job, timeout: float, first_look: float | None) -> list:
        self.seq += 1
        frames = _frames((self.seq, case, job, _parent_place(), case_memory(self.size)))
        for conn in self.conns:
            try:
                _send_frames(conn, frames)
            except OSError:
                pass  # that worker is gone: its sentinel reports it below
        started = time.monotonic()
        deadline = started + timeout
        start_up_look = None if first_look is None else started + first_look
        results: dict[int, RankOutputs] = {}
        failures: dict[int, tuple[str, str, str | None]] = {}
        declines: dict[int, tuple[str, str, str | None]] = {}  # ranks that declined the case (Unsupported): finished
        pending = set(range(self.size))
        first_failure = None
        look_at, last_look = None, None  # deadlock watch: once a rank has finished, are the others stuck?
        while pending:
            now = time.monotonic()
            limit = deadline if first_failure is None else min(deadline, first_failure + _FAILURE_GRACE)
            watching = look_at is not None and first_failure is None  # a failure ends the case anyway
            if watching and now >= look_at:
                stuck = self._stuck(pending, sorted([*results, *declines]))
                if stuck is not None and stuck == last_look:
                    raise ImplError(f"{describe_failures(declines)}; {stuck}" if declines else stuck)
                look_at, last_look = now + _DEADLOCK_POLL, stuck
                continue
            if start_up_look is not None and now >= start_up_look and first_failure is None:
                if self._starting_up(pending):
                    start_up_look = now + LOOK_AGAIN
                else:  # (not importing or compiling: what the first case's allowance is for)
                    start_up_look, deadline, timeout = None, now, round(now - started, 1)
                continue
            if now >= limit:
                break
            wake = min(limit, look_at) if watching else limit
            if start_up_look is not None:
                wake = min(wake, start_up_look)
            ready = set(_wait_any([self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending],
                                  wake - now))
            for r in sorted(pending):
                if self.conns[r] not in ready and self.procs[r].sentinel not in ready:
                    continue
                msg = self._read(r)
                pending.discard(r)
                if msg is None:
                    failures[r] = ("died", self._death(r), None)
                elif msg[0] != self.seq:
                    failures[r] = ("raised", f"answered case #{msg[0]} instead of #{self.seq}", None)
                elif msg[1] == "ok" or msg[2][0] == UNSUPPORTED:  # (a rank that declined the case finished it too)
                    (results if msg[1] == "ok" else declines)[r] = msg[2]
                    if look_at is None:
                        look_at = time.monotonic() + _DEADLOCK_GRACE
                else:
                    failures[r] = msg[2]
                if failures and first_failure is None:
                    first_failure = time.monotonic()
        # A rank that died or hung left no word of the kernels it called but its journal: a known issue of one of them
        # may explain it
        silent = sorted({*pending, *(r for r, f in failures.items() if f[0] == "died")})
        if failures or (declines and results):
            raise _with_ops(ImplError(describe_failures({**failures, **declines})), self._journals(silent))
        if pending:
            raise _with_ops(CaseTimeout(*self._timeout_message(pending, sorted([*results, *declines]), timeout)),
                            self._journals(silent))
        if declines:  # (every rank declined the case: a SKIP)
            raise Unsupported(declined(declines, self.size))
        return [results[r] for r in range(self.size)]

    def _journals(self, ranks) -> frozenset[str]:
        return frozenset().union(*(_journal(self.stderr_paths[r]) for r in ranks))

    def _read(self, r: int):
        """The next message from rank r, or None when its pipe is closed (it died)."""
        conn = self.conns[r]
        try:
            if conn.poll(0):
                return _recv(conn)
        except (EOFError, OSError):
            return None
        except Exception as e:  # noqa: BLE001 - e.g. outputs of a class the parent cannot import
            return (self.seq, "failed", ("raised", f"sent outputs the parent cannot read: {exception_text(e)}", None))
        return None  # only the sentinel was ready: the process ended without a message

    def _death(self, r: int) -> str:
        proc = self.procs[r]
        proc.join(2.0)
        last = _last_line(self.stderr_paths[r])
        return exit_text(proc.exitcode) + (f": {last}" if last else "")

    def where(self, ranks) -> dict[int, tuple[str | None, str | None]]:
        """Ask each rank's control thread where its main thread is (best effort, bounded)."""
        asked = []
        for r in ranks:
            try:
                _send(self.ctrls[r], "where")
                asked.append(r)
            except OSError:
                pass
        answers: dict[int, tuple[str | None, str | None]] = {}
        deadline = time.monotonic() + _WHERE_BUDGET
        while len(answers) < len(asked):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = _wait_any([self.ctrls[r] for r in asked if r not in answers], left)
            for r in asked:
                if self.ctrls[r] in ready and r not in answers:
                    try:
                        answers[r] = _recv(self.ctrls[r])
                    except (EOFError, OSError):
                        answers[r] = _NOWHERE
        return answers

    def _starting_up(self, pending: set[int]) -> bool:
        """Some pending rank is importing or compiling, and the others wait for it in a collective."""
        answers = self.where(sorted(pending))
        places = [answers.get(r, _NOWHERE) for r in pending]  # (collective, location, starting, begun)
        return any(starting for _, _, starting, _ in places) and all(starting or coll for coll, _, starting, _ in places)

    def _stuck(self, pending: set[int], finished: list[int]) -> str | None:
        """The deadlock message when every pending rank waits in a torch.distributed collective that
        the finished ranks, having left the case, can never join; None otherwise."""
        answers = self.where(sorted(pending))
        if not all(answers.get(r, _NOWHERE)[0] for r in pending):
            return None
        places = {f"{answers[r][0]}" + (f" at {answers[r][1]}" if answers[r][1] else "") for r in pending}
        return never_joined(finished, sorted(pending), "; ".join(sorted(places)))

    def _timeout_message(self, pending: set[int], finished: list[int], timeout: float) -> tuple[str, float, str | None]:
        """(what timed out where, the limit, where the case still was if no pending rank had begun the
        implementation's part: CaseTimeout's)."""
        answers = self.where(sorted(pending))
        places = [answers.get(r, _NOWHERE) for r in sorted(pending)]
        # (a case that ran out while importing or compiling is not told apart from an implementation that hangs there:
        # a jitted function tracing its own loop; only a case its implementation never began is the limit's)
        unstarted = "the worker was still reading the case in, before the implementation began" \
            if not finished and not any(begun for *_, begun in places) else None
        waiting = {r: answers[r][0] for r in pending if r in answers and answers[r][0]}
        culprits = sorted(r for r in pending if r not in waiting)
        parts = []
        if culprits:
            by_where: dict[str, list[int]] = {}
            for r in culprits:
                loc = answers.get(r, _NOWHERE)[1]
                by_where.setdefault(f" at {loc}" if loc else "", []).append(r)
            parts += [f"{rank_list(rs)}: timed out after {timeout:g} s{loc}" for loc, rs in by_where.items()]
            by_coll: dict[str, list[int]] = {}
            for r, coll in waiting.items():
                by_coll.setdefault(coll, []).append(r)
            parts += [f"{rank_list(rs)} waiting in {coll}" for coll, rs in by_coll.items()]
        else:  # every pending rank waits in a collective: they disagree about which ones to call
            for r in sorted(pending):
                loc = answers[r][1]
                parts.append(f"rank {r}: timed out after {timeout:g} s waiting in {waiting[r]}"
                             + (f" at {loc}" if loc else ""))
        text = "; ".join(parts)
        if finished:
            text += f" (other ranks finished: {', '.join(map(str, finished))})"
        return text, timeout, unstarted

    # -- shutdown ---------------------------------------------------------------------------
    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def stop(self) -> None:
        """Ask the workers to exit, then kill whatever is left."""
        for conn in self.conns:
            try:
                _send(conn, None)
            except OSError:
                pass
        deadline = time.monotonic() + _EXIT_GRACE
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        self._finalizer()
        self._stderr_dir.cleanup()



class WorkerPool:
    """`size` persistent worker processes serving case after case: started on demand, killed after
    any failure (their state is unknown) and started afresh for the next case, closed at exit.
    `group`: the workers join one gloo process group (the gloo world's ranks). `setup`: a picklable function each worker
    runs before anything else, there only (never in this process or the fork server)."""

    kind = "worker pool"

    def __init__(self, size: int, timeout: float = DEFAULT_TIMEOUT, *, group: bool = True,
                 startup_timeout: float = STARTUP_TIMEOUT, name: str = "workers",
                 setup: Callable[[], None] | None = None):
        self.size = size
        self.group = group
        self.name = name
        self.setup = setup
        self.timeout = positive_seconds(timeout, "timeout")
        self.startup_timeout = positive_seconds(startup_timeout, "startup_timeout")
        self.starts = 0           # how many times worker processes were started (1 + restarts)
        self._workers: _Workers | None = None
        self._closed = False
        self._lock = threading.RLock()
        _LIVE.add(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pids(self) -> list[int]:
        """The worker pids, rank order (empty while no workers are running)."""
        w = self._workers
        return list(w.pids) if w else []

    def start(self):
        """Start the workers now (running a case does it on demand); returns self."""
        with self._lock:
            self._check_open()
            self._ensure_started(self.timeout)
        return self

    def run_job(self, case, job, timeout: "CaseLimit | float | None" = None, load=None) -> list:
        """Every worker's result of `job` on `case`, in rank order, under the case's time limit
        (the pool's own when None), timed from the moment the workers are ready and have run the
        `load` job (e.g. ("load", spec): importing the implementation), once per fresh set of workers.

        Raises ImplError naming the rank(s) and the cause when a worker raises, dies or runs past
        the limit (CaseTimeout); the workers are then killed and the next call starts fresh ones."""
        limit = as_limit(self.timeout if timeout is None else timeout)
        with self._lock:
            self._check_open()
            workers = self._ensure_started(limit.seconds(case))
            try:
                key = None if load is None else pickle.dumps(load, protocol=pickle.HIGHEST_PROTOCOL)
                if key is not None and key not in workers.loaded:
                    answers = workers.run_case(case, load, self.startup_timeout)
                    setup = next((a[1] for a in answers if isinstance(a, tuple) and a[0] == "setup"), None)
                    if setup is not None:
                        raise SetupError(setup)
                    workers.loaded.add(key)
                return limit.run(case, lambda seconds: workers.run_case(case, job, seconds, limit.first_look(case)))
            except Unsupported:  # every rank declined and finished the case: the workers stay as after a success
                raise
            except BaseException:  # ImplError, KeyboardInterrupt, ...: the workers' state is unknown
                self._discard(kill=True)
                raise

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        with self._lock:
            self._closed = True
            self._discard(kill=False)
        _LIVE.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"this {self.kind} is closed")

    def _ensure_started(self, timeout: float) -> _Workers:
        w = self._workers
        if w is not None and (not w.alive() or w.gloo_timeout < timeout + 30):
            self._discard(kill=not w.alive())  # a worker died between cases, or gloo's timeout is too short
            w = None
        if w is None:
            w = self._workers = self._start(_gloo_timeout(max(self.timeout, timeout)))
        return w

    def _start(self, gloo_timeout: float) -> _Workers:
        problem = ""
        for _ in range(_START_ATTEMPTS):
            workers = _Workers(self.size, gloo_timeout, self.group, self.name, self.setup)
            self.starts += 1
            try:
                workers.wait_ready(self.startup_timeout)
                return workers
            except _StartFailed as e:
                workers.kill()
                problem = str(e)
                if "address already in use" not in problem.lower() and "eaddrinuse" not in problem.lower():
                    break
            except BaseException:
                workers.kill()
                raise
        raise WorldStartError(f"{self.kind} did not start: {problem}")

    def _discard(self, kill: bool) -> None:
        w, self._workers = self._workers, None
        if w is not None:
            w.kill() if kill else w.stop()


def _gloo_timeout(case_timeout: float) -> float:
    """gloo's own collective timeout: well above the case's, so the parent's limit decides first."""
    return max(2 * case_timeout, case_timeout + 60)


# ----------------------------------------------------------------------------- process-wide
_LIVE: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def close_all() -> None:
    """Close every worker pool of this process (registered with atexit)."""
    for pool in list(_LIVE):
        pool.close()


atexit.register(close_all)
