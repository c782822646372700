"""An interrupted run ends cleanly: Ctrl-C (SIGINT) or SIGTERM during a gloo run ends promptly with the
summary of what ran, a complete JSON document, exit 130 / 143, no traceback and no process left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the run's worker processes")
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_gloo_run_keeps_the_report_and_leaves_nothing(sig, status):
    # The first cases (one rank) pass; the first two-rank case hangs on rank 1 for its 60 s timeout.
    proc = subprocess.Popen([sys.executable, "-m", "normcheck", "compare", "--op", "syncbn", "--impl",
                             "tests._world_faults:hangs_on_rank1", "--backend", "gloo", "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, CI="1"))
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < 3:  # the forkserver and two rank processes
        seen |= descendants(proc.pid)
        time.sleep(0.2)
    time.sleep(1.0)
    seen |= descendants(proc.pid)
    assert len(seen) >= 3, "the two-rank gloo world never started"
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 15, "the run did not end promptly"
    assert proc.returncode == status, err
    assert "Traceback" not in err and f"interrupted by {sig.name}" in err
    document = json.loads(out)
    assert document["exit_status"] == status and document["summary"]["total"] == len(document["cases"])
    assert all(c["verdict"] == "PASS" for c in document["cases"])
    time.sleep(2.0)
    assert not [p for p in seen if alive(p)], "processes of the run outlived it"
