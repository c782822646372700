"""Nothing normcheck starts outlives it, a SIGKILL of normcheck included (Linux; elsewhere these are no-ops).

A SIGKILLed process runs no code, so its children must notice by themselves, and a worker blocked in C holding the GIL
runs no Python code either (its control thread never sees its pipe close). So:
* the fork server asks the kernel for SIGTERM when normcheck dies (PR_SET_PDEATHSIG), handled in Python: the server
  is single-threaded and waits in `select`, so its handler runs at once; it SIGKILLs every worker's process group and
  exits. Armed from the module's import, the first the server preloads, so a server still importing torch goes too;
* each worker is the leader of a process group of its own, which the children an implementation starts (a compiler,
  `sleep 300`) join: killing the group (here on the fork server's death, in workers.py whenever normcheck stops or
  replaces a worker) takes them with it, even once the worker itself is gone;
* each worker also gets SIGKILL when the fork server dies (the server's SIGKILL by core.forkserver.stop, say);
* multiprocessing's resource tracker exits by itself once every process holding its pipe (normcheck, the server,
  the workers) is gone.
A child the implementation puts in a session or group of its own (`start_new_session=True`) is beyond reach.
Standard library only: the server imports it before torch.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PARENT = "NORMCHECK_FORKSERVER_PARENT"  # set while the fork server starts: see arm_server
_PR_SET_PDEATHSIG = 1
server_pid: int | None = None  # in the fork server and the workers forked from it: the server's pid


def die_with_parent(sig: int, parent: int) -> bool:
    """Have the kernel send `sig` to this process when its parent (the thread that started it) ends; False where
    that cannot be asked. A parent that died before the request (this process already reparented) is `sig` now."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # (the race: it died between our start and the request)
        os.kill(os.getpid(), sig)
    return True


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by worker `pid` (the worker and what it started), if there is one."""
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def lead_own_group() -> None:
    """Make this process (a worker, just forked) the leader of a new process group, its children's."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpgid(0, 0)


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = f.read().rsplit(")", 1)[1].split()[1]
                except (OSError, IndexError):
                    continue
                if ppid == me:
                    found.append(int(entry))
    return found


def _normcheck_died(signum, frame) -> None:
    for pid in _children():  # (the workers; one just forked may not lead its group yet: killed by pid as well)
        kill_group(pid)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(128 + signum)


def _preloaded_by_fork_server() -> bool:
    from multiprocessing import forkserver

    frame = sys._getframe()
    while frame is not None and frame.f_code is not forkserver.main.__code__:
        frame = frame.f_back
    return frame is not None


def arm_server() -> None:
    """In the fork server, preloading this module: die with normcheck, whose pid PARENT names. PARENT ends in
    " unarmed" where a thread other than normcheck's main thread starts the server: the kernel's parent is the
    starting thread, whose end would take down a server that still serves (that server ends as before, once normcheck
    and its workers are gone). Any other process, one that inherited PARENT included, is left alone."""
    global server_pid
    parent, *unarmed = os.environ.get(PARENT, str(os.getpid())).split()
    if parent == str(os.getpid()) or not _preloaded_by_fork_server():
        return
    del os.environ[PARENT]  # (the workers and their children do not see it)
    server_pid = os.getpid()
    if not unarmed:
        signal.signal(signal.SIGTERM, _normcheck_died)
        die_with_parent(signal.SIGTERM, int(parent))


def arm_worker() -> None:
    """In a worker, first thing after the fork: lead its own group, die with the fork server, and leave SIGTERM to
    its default (the server's handler, inherited through the fork, would kill this process's children alone)."""
    lead_own_group()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if server_pid is not None:
        die_with_parent(signal.SIGKILL, server_pid)


arm_server()
