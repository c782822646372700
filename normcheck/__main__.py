"""`python -m normcheck` and the `normcheck` command: check the arguments (normcheck.arguments loads no framework),
then start the workers' fork server first when the run will need one, so its torch import overlaps this process's."""
import atexit
import os
import signal
import sys

from .core.forkserver import quiet_threads, start_early

_NO_WORKERS = ("lockstep", "env")  # --backend values whose ranks are threads or a launcher's processes


def run(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quiet_threads()  # (before this process loads NumPy or torch)
    # SIGTERM outside the cases (the CLI reports one that arrives among them) ends the run as an exit does, so
    # what it started is stopped (core.forkserver.stop), rather than killing this process alone
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        from .arguments import parse  # (torch-free: a usage error is told before torch loads, here or in a server)
        from .core.errors import UsageError

        try:
            parse(argv)
        except UsageError as e:
            print(f"normcheck: error: {e}", file=sys.stderr)
            return 2
        if argv[:1] == ["compare"] and not any(b.startswith(_NO_WORKERS) for b in _option_values(argv, "--backend")):
            start_early()
        from .cli import main

        status = main(argv)
    except KeyboardInterrupt:  # Ctrl-C while torch is still importing: one line, as the CLI says it later
        print("normcheck: interrupted before any case ran", file=sys.stderr)
        status = 130
    except Exception:  # (a Ctrl-C that landed inside an extension's import can come out as another exception)
        if not _INTERRUPTED:
            raise
        print("normcheck: interrupted before any case ran", file=sys.stderr)
        status = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run is over: nothing may interrupt its exit
    if status == 130:
        # An interrupt that passed through Python code run from C (pybind11's exec in torch's import) marks the
        # interpreter to kill itself with SIGINT at exit, caught or not: the exit status would be a kill, not 130.
        # The exit functions run (they stop the fork server and the workers), then the process exits as it says.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


_INTERRUPTED: list[int] = []  # the SIGINTs that arrived


def _interrupt(signum, frame):
    """Ctrl-C as Python's own handler takes it (a KeyboardInterrupt here), remembered: one that lands inside a C
    extension's import (torch's) may come out of it as another exception, which is then the interrupt's."""
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def _terminated(signum, frame):
    print("normcheck: terminated (SIGTERM)", file=sys.stderr)
    sys.exit(143)  # 128 + SIGTERM, as shells report it


def _option_values(argv: list[str], option: str) -> list[str]:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(option + "=")]
    return values + [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]


if __name__ == "__main__":  # worker processes never import the main module; guarded all the same
    sys.exit(run())
