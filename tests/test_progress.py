"""The progress bar: shown to a person at a terminal, never in CI logs, pipes or JSON output."""
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time

from normcheck.outputs.progress import wants_progress


def test_only_a_terminal_outside_ci_gets_a_bar(monkeypatch):
    master, replica = pty.openpty()
    with os.fdopen(replica, "w") as terminal, tempfile.TemporaryFile("w") as file:
        monkeypatch.delenv("CI", raising=False)
        assert wants_progress(stream=terminal)
        assert not wants_progress(stream=file)                 # redirected to a file or a pipe
        assert not wants_progress(quiet=True, stream=terminal)  # --json
        monkeypatch.setenv("CI", "true")
        assert not wants_progress(stream=terminal)
        monkeypatch.setenv("CI", "false")
        assert wants_progress(stream=terminal)
    os.close(master)


def stderr_on_a_terminal(*argv: str) -> tuple[subprocess.Popen, list[bytes]]:
    """Start normcheck with stderr on a pseudo-terminal (stdout, not a terminal, is discarded)."""
    master, replica = pty.openpty()
    # A new pty is 0 columns wide, and tqdm fits its bar to that: give it a terminal's size.
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.Popen([sys.executable, "-m", "normcheck", *argv], stdout=subprocess.DEVNULL, stderr=replica,
                            env=env)
    os.close(replica)
    return proc, master


def drain(procs_and_masters) -> list[str]:
    """Read every terminal until its process exits (a full pty buffer would block the writer)."""
    shown = {m: b"" for _, m in procs_and_masters}
    deadline = time.monotonic() + 120
    open_ = set(shown)
    while open_ and time.monotonic() < deadline:
        for m in select.select(list(open_), [], [], 0.5)[0]:
            try:
                chunk = os.read(m, 4096)
            except OSError:  # EIO: the process closed its end
                chunk = b""
            if chunk:
                shown[m] += chunk
            else:
                open_.discard(m)
    for proc, m in procs_and_masters:
        proc.wait(timeout=60)
        os.close(m)
    return [shown[m].decode(errors="replace") for _, m in procs_and_masters]


def test_a_long_run_shows_a_bar_on_the_terminal_and_json_mode_does_not():
    # 300 small cases: 2 s or more (each runs twice), well past the bar's DELAY_S, so a missing bar is a real miss.
    run = ["compare", "--one-case", "--op", "batchnorm", "--impl", "baseline", "--shape", "64,3,32", "--cases", "300"]
    table = stderr_on_a_terminal(*run)
    as_json = stderr_on_a_terminal(*run, "--json")
    table_terminal, json_terminal = drain([table, as_json])
    assert "batchnorm / baseline:" in table_terminal and "/300 [" in table_terminal  # tqdm's "k/300 [elapsed<left"
    assert json_terminal == ""
    assert table[0].returncode == 0 and as_json[0].returncode == 0
