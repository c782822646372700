"""The gloo world: real torch.distributed over gloo on 127.0.0.1, one persistent process per rank.

    with GlooWorld(3) as world:
        per_rank = world.run(Case("syncbn", (8, 4, 5, 5), dtype="f64", split=(3, 0, 5)), "my_syncbn:fn")

Design
------
* One world per world size (``get_world`` keeps one per size for the process). A pool of the
  largest size with subgroups would share start-up cost between sizes, but a failure in any
  subgroup would leave the whole pool in an unknown state; per-size worlds fail and restart alone.
* Workers are ``multiprocessing`` 'forkserver' processes (no fork of a threaded parent): the fork
  server imports torch and normcheck once, each worker forks from it (~0.1 s), joins the process
  group and then serves cases until closed.
  The parent sends only ``(case, impl_spec)``; every rank makes the case's inputs itself
  (deterministic), runs ``normcheck.frameworks.torch.run_rank`` and sends its outputs back (plain
  ``pickle``: bytes, no shared memory or file descriptors travel).
* Rendezvous: the parent hosts the ``TCPStore``, bound to port 0, so the OS picks a free port and
  the parent keeps it bound for the world's life: two worlds (or two test runs) on one machine can
  never collide, and there is no gap between choosing a port and binding it. Start-up is still
  retried when a worker reports "address in use".
* Failures: a rank that raises, returns bad outputs, dies or runs past the per-case timeout fails
  the case with an ``ImplError`` naming the rank(s) and the cause. Peers that merely failed or
  waited in a collective because of it are not blamed: on a timeout each worker's control thread
  reports where its main thread is (in a torch.distributed collective, or in which user frame).
  After any failure the process group's state is unknown, so every worker is killed (SIGKILL) and
  the next ``run`` starts a fresh world.
* Nothing is left behind: ``close()`` asks workers to exit, then kills what is left; a finaliser
  does the same when a world is garbage-collected or the interpreter exits; workers are daemonic
  and exit on their own when the parent disappears (their control pipe closes).
* gloo's own collective timeout is set well above the per-case timeout, so the parent's timeout
  (which kills the stuck workers) always decides first.
* As with any 'spawn' multiprocessing, a script that starts a world needs the
  ``if __name__ == "__main__":`` guard (each worker imports the main module).
"""
from __future__ import annotations

import atexit
import datetime
import multiprocessing as mp
import os
import pickle
import signal
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait as _wait_any
from pathlib import Path

from ..cases import Case
from ..core.errors import ImplError, UsageError
from ..core.loading import load_callable
from ..core.text import clip, exception_text, rank_list
from ..frameworks.torch import run_rank
from ..kernels.syncbn import cpu_primitives
from .core import DEFAULT_TIMEOUT, RankOutputs, positive_seconds
from .failures import _torch_dirs, collective_of, describe_failures, exit_text, failure_of, never_joined

__all__ = ["DEFAULT_TIMEOUT", "GlooWorld", "WorldStartError", "close_all", "get_world", "run_gloo"]

STARTUP_TIMEOUT = 180.0       # all ranks imported torch and joined the group (8 ranks on 2 cores: ~15 s)
_HOST = "127.0.0.1"
_FAILURE_GRACE = 0.25         # after one rank fails, how long the others get to report before the kill
_DEADLOCK_GRACE = 1.0         # after one rank finished, when to look whether the others are stuck in a collective
_DEADLOCK_POLL = 0.5          # and how often after that (a deadlock is two identical looks in a row)
_WHERE_BUDGET = 1.0           # how long the parent waits for "where is your main thread" answers
_EXIT_GRACE = 3.0             # close(): how long workers get to exit on their own before SIGKILL
_START_ATTEMPTS = 3


class WorldStartError(RuntimeError):
    """The world's worker processes could not be started (not the implementation's fault)."""


# ----------------------------------------------------------------------------- wire format
def _send(conn, obj) -> None:
    # Plain pickle, not the multiprocessing pickler: torch registers shared-memory reductions for
    # tensors there, which would move outputs into shared memory and pass file descriptors.
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


# ----------------------------------------------------------------------------- messages
def _last_line(path: str) -> str:
    """The last non-empty line a worker wrote to stderr (trimmed), or ''."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
    except OSError:
        return ""
    return clip(lines[-1], 200) if lines else ""


# ----------------------------------------------------------------------------- worker side
def _describe_stack(frame) -> tuple[str | None, str | None]:
    """(collective, location) of a thread's current stack: the torch.distributed call it waits in,
    and its innermost frame outside torch and the standard library ("file.py:12 in fn")."""
    if frame is None:
        return None, None
    stack = traceback.extract_stack(frame)
    torch_dir, _ = _torch_dirs()
    stdlib = {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")}
    outside = [f for f in stack if not f.filename.startswith(torch_dir)
               and not any(f.filename.startswith(s) for s in stdlib)]
    loc = (outside or stack)[-1] if stack else None
    where = f"{os.path.basename(loc.filename)}:{loc.lineno} in {loc.name}" if loc else None
    return collective_of(stack), where


def _control_loop(ctrl, main_ident: int) -> None:
    """Answer "where" while the main thread may be stuck; exit when the parent goes away."""
    while True:
        try:
            msg = _recv(ctrl)
            if msg == "where":
                _send(ctrl, _describe_stack(sys._current_frames().get(main_ident)))
        except (EOFError, OSError):
            os._exit(70)  # the parent closed our pipe or died: nobody will ever read our results


def _worker_main(rank: int, size: int, port: int, gloo_timeout: float, conn, ctrl, stderr_path: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    # What a dying worker prints (a C++ abort message, say) goes to a file the parent quotes in its
    # failure message, instead of interleaving with the report on the terminal.
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        cpu_primitives.register()  # torch's SyncBN primitives get CPU kernels in this process only
        threading.Thread(target=_control_loop, args=(ctrl, threading.get_ident()), daemon=True,
                         name="normcheck-control").start()
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
        seq, case, spec, parent_cwd = msg
        if parent_cwd not in sys.path:
            sys.path.insert(0, parent_cwd)  # `module:attr` resolves against the parent's directory
        try:
            fn = fns.get(spec)
            if fn is None:
                fn = fns[spec] = load_callable(spec)
            reply = (seq, "ok", run_rank(case.record, fn, case, case.make_inputs(), rank, group, size))
        except BaseException as e:  # noqa: BLE001 - SystemExit from an implementation is a failure too
            reply = (seq, "failed", failure_of(e))
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            data = pickle.dumps((seq, "failed", ("raised", f"outputs cannot be sent back: {exception_text(e)}", None)))
        conn.send_bytes(data)
    dist.destroy_process_group()
    # Run atexit hooks and flush, but skip the interpreter's module teardown (most of a second
    # with torch loaded, times every rank on 2 cores): closing a world stays quick.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- parent side
def _worker_context():
    """'forkserver' with torch and normcheck preloaded: a fresh worker forks from a process that
    has already imported them (~0.1 s instead of ~1.5 s of CPU per rank), so restarting a world
    after a failure is cheap. The server itself is single-threaded, so forking it is safe."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "normcheck.worlds.gloo"])
    return ctx



def _kill(procs: list, conns: list, holder: list) -> None:
    """SIGKILL and reap every process; close the pipes; release the TCPStore. Idempotent."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(10)
    for c in conns:
        c.close()
    holder.clear()


class _StartFailed(Exception):
    pass


class _Workers:
    """One incarnation of a world: W processes, their pipes, and the TCPStore they met at."""

    def __init__(self, size: int, gloo_timeout: float):
        import torch.distributed as dist

        self.size = size
        self.gloo_timeout = gloo_timeout
        self.seq = 0
        store = dist.TCPStore(_HOST, 0, None, True, timeout=datetime.timedelta(seconds=gloo_timeout),
                              wait_for_workers=False)
        self.port = store.port
        self._holder = [store]
        ctx = _worker_context()
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
                proc = ctx.Process(target=_worker_main, name=f"normcheck-gloo{size}-rank{rank}", daemon=True,
                                   args=(rank, size, self.port, gloo_timeout, child_conn, child_ctrl,
                                         self.stderr_paths[rank]))
                self.procs.append(proc)
                self.conns.append(conn)
                self.ctrls.append(ctrl)
                pipes += [conn, ctrl]
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
    def run_case(self, case: Case, spec: str, timeout: float) -> list[RankOutputs]:
        self.seq += 1
        data = pickle.dumps((self.seq, case, spec, os.getcwd()), protocol=pickle.HIGHEST_PROTOCOL)
        for conn in self.conns:
            try:
                conn.send_bytes(data)
            except OSError:
                pass  # that worker is gone: its sentinel reports it below
        deadline = time.monotonic() + timeout
        results: dict[int, RankOutputs] = {}
        failures: dict[int, tuple[str, str, str | None]] = {}
        pending = set(range(self.size))
        first_failure = None
        look_at, last_look = None, None  # deadlock watch: once a rank has finished, are the others stuck?
        while pending:
            now = time.monotonic()
            limit = deadline if first_failure is None else min(deadline, first_failure + _FAILURE_GRACE)
            watching = look_at is not None and first_failure is None  # a failure ends the case anyway
            if watching and now >= look_at:
                stuck = self._stuck(pending, sorted(results))
                if stuck is not None and stuck == last_look:
                    raise ImplError(stuck)
                look_at, last_look = now + _DEADLOCK_POLL, stuck
                continue
            if now >= limit:
                break
            wake = min(limit, look_at) if watching else limit
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
                elif msg[1] == "ok":
                    results[r] = msg[2]
                    if look_at is None:
                        look_at = time.monotonic() + _DEADLOCK_GRACE
                else:
                    failures[r] = msg[2]
                if failures and first_failure is None:
                    first_failure = time.monotonic()
        if failures:
            raise ImplError(describe_failures(failures))
        if pending:
            raise ImplError(self._timeout_message(pending, sorted(results), timeout))
        return [results[r] for r in range(self.size)]

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
                        answers[r] = (None, None)
        return answers

    def _stuck(self, pending: set[int], finished: list[int]) -> str | None:
        """The deadlock message when every pending rank waits in a torch.distributed collective that
        the finished ranks, having left the case, can never join; None otherwise."""
        answers = self.where(sorted(pending))
        if not all(answers.get(r, (None, None))[0] for r in pending):
            return None
        places = {f"{answers[r][0]}" + (f" at {answers[r][1]}" if answers[r][1] else "") for r in pending}
        return never_joined(finished, sorted(pending), "; ".join(sorted(places)))

    def _timeout_message(self, pending: set[int], finished: list[int], timeout: float) -> str:
        answers = self.where(sorted(pending))
        waiting = {r: answers[r][0] for r in pending if r in answers and answers[r][0]}
        culprits = sorted(r for r in pending if r not in waiting)
        parts = []
        if culprits:
            by_where: dict[str, list[int]] = {}
            for r in culprits:
                loc = answers.get(r, (None, None))[1]
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
        return text

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


class GlooWorld:
    """`world_size` worker processes joined in a gloo process group, serving case after case."""

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT, *,
                 startup_timeout: float = STARTUP_TIMEOUT):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise UsageError(f"gloo world size must be a positive integer, got {world_size!r}")
        self.world_size = world_size
        self.timeout = positive_seconds(timeout, "timeout")
        self.startup_timeout = positive_seconds(startup_timeout, "startup_timeout")
        self.starts = 0           # how many times worker processes were started (1 + restarts)
        self._workers: _Workers | None = None
        self._closed = False
        self._lock = threading.RLock()
        self._specs: dict[tuple[str, str], str] = {}
        _LIVE.add(self)

    # -- public -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pids(self) -> list[int]:
        """The worker pids, rank order (empty while no workers are running)."""
        w = self._workers
        return list(w.pids) if w else []

    @property
    def port(self) -> int | None:
        """The TCP port of this world's rendezvous store (None while no workers are running)."""
        w = self._workers
        return w.port if w else None

    def start(self) -> GlooWorld:
        """Start the workers now (``run`` does it on demand); returns self."""
        with self._lock:
            self._check_open()
            self._ensure_started(self.timeout)
        return self

    def run(self, case: Case, impl_spec: str, timeout: float | None = None) -> list[RankOutputs]:
        """Run `case` on every rank with the implementation `impl_spec` (``module:attr`` or
        ``path/to/file.py:attr``); the per-rank outputs in rank order.

        Raises ImplError naming the rank(s) and the cause when a rank raises, returns bad outputs,
        dies or times out (the workers are then killed; the next call starts fresh ones), and
        UsageError for a case or spec this world cannot run.
        """
        timeout = self.timeout if timeout is None else positive_seconds(timeout, "timeout")
        with self._lock:
            self._check_open()
            self._check_case(case)
            spec = self._checked_spec(impl_spec)
            workers = self._ensure_started(timeout)
            try:
                return workers.run_case(case, spec, timeout)
            except BaseException:  # ImplError, KeyboardInterrupt, ...: the group's state is unknown
                self._discard(kill=True)
                raise

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        with self._lock:
            self._closed = True
            self._discard(kill=False)
        _LIVE.discard(self)

    def __enter__(self) -> GlooWorld:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (f"port {self.port}, pids {self.pids}" if self._workers else "idle")
        return f"GlooWorld({self.world_size}, {state})"

    # -- internals --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"this gloo world of size {self.world_size} is closed; use get_world() or a new GlooWorld")

    def _check_case(self, case: Case) -> None:
        if not isinstance(case, Case):
            raise UsageError(f"a gloo world runs a Case, got {type(case).__name__}")
        if case.split is None:
            raise UsageError(f"case {case.label} has no split: a gloo world needs per-rank batch sizes")
        if len(case.split) != self.world_size:
            raise UsageError(f"case split {case.split} is for {len(case.split)} ranks; this gloo world has "
                             f"{self.world_size}")

    def _checked_spec(self, spec: str) -> str:
        """Check in the parent that `spec` loads (a clear UsageError now instead of a failure on
        every rank); relative file paths are made absolute for the workers."""
        key = (os.getcwd(), spec)
        if key in self._specs:
            return self._specs[key]
        if not isinstance(spec, str):
            raise UsageError(f"a gloo world loads implementations by spec (module:attr or file.py:attr), "
                             f"got {type(spec).__name__}")
        module, _, attr = spec.rpartition(":")
        resolved = spec
        if module.endswith(".py") and Path(module).is_file():
            resolved = f"{Path(module).resolve()}:{attr}"
        load_callable(resolved)
        self._specs[key] = resolved
        return resolved

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
            workers = _Workers(self.world_size, gloo_timeout)
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
        raise WorldStartError(f"gloo world of size {self.world_size} did not start: {problem}")

    def _discard(self, kill: bool) -> None:
        w, self._workers = self._workers, None
        if w is not None:
            w.kill() if kill else w.stop()


def _gloo_timeout(case_timeout: float) -> float:
    return max(2 * case_timeout, case_timeout + 60)


# ----------------------------------------------------------------------------- process-wide
_LIVE: weakref.WeakSet[GlooWorld] = weakref.WeakSet()
_WORLDS: dict[int, GlooWorld] = {}
_WORLDS_LOCK = threading.Lock()


def get_world(world_size: int, timeout: float = DEFAULT_TIMEOUT) -> GlooWorld:
    """This process's world of `world_size` ranks (created on first use, kept open; a world whose
    workers were killed after a failure restarts them on its next run; a closed one is replaced).
    `timeout` becomes its default per-case timeout."""
    with _WORLDS_LOCK:
        world = _WORLDS.get(world_size)
        if world is None or world.closed:
            world = _WORLDS[world_size] = GlooWorld(world_size, timeout)
        else:
            world.timeout = positive_seconds(timeout, "timeout")
        return world


def run_gloo(case: Case, impl_spec: str, timeout: float = DEFAULT_TIMEOUT) -> list[RankOutputs]:
    """Run `case` in this process's gloo world of size len(case.split)."""
    if not isinstance(case, Case) or case.split is None:
        raise UsageError("a gloo world needs a Case with a split (per-rank batch sizes)")
    return get_world(len(case.split), timeout).run(case, impl_spec)


def close_all() -> None:
    """Close every gloo world of this process (registered with atexit)."""
    for world in list(_LIVE):
        world.close()


atexit.register(close_all)


def gloo_ranks(impl, case: Case, inputs, timeout: float) -> list[RankOutputs]:
    """The gloo World's run_ranks: every rank makes the case's inputs itself from the case."""
    return get_world(len(case.split), timeout).run(case, impl.spec, timeout)
