"""A run whose implementation hangs on every case ends in seconds, not a time limit per case: the first case keeps
the start-up allowance only while it is importing or compiling (its worker looks at 10 s), the next ones get their
yardstick, and the run stops once 10 have timed out with none finished. (A file of its own: most of its half minute
is waiting, which the gate's other worker fills.)"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from normcheck.cases.sweep import default_sweep
from normcheck.engine import FAIL
from normcheck.worlds.limits import DEFAULT_TIMEOUT, FIRST_LOOK, STUCK_AFTER

ROOT = Path(__file__).resolve().parents[1]
FAULTS = "tests._solo_faults"


def test_the_default_sweep_of_an_implementation_that_hangs_on_every_case_ends_in_seconds():
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "normcheck", "compare", "--op", "batchnorm", "--impl",
                           f"{FAULTS}:hangs_always", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    seconds = time.monotonic() - start
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert seconds < 90 and len(document["cases"]) == STUCK_AFTER < len(default_sweep("batchnorm"))  # (28 s idle)
    assert all(c["verdict"] == FAIL and c["message"].startswith("timed out after") for c in document["cases"])
    limits = [c["time_limit_s"] for c in document["cases"]]
    # (the first case's start-up allowance, cut at the first look: it was neither importing nor compiling)
    assert limits[0] == FIRST_LOOK and max(limits[1:]) < DEFAULT_TIMEOUT / 2, limits
    assert document["stopped"].startswith("stopped: 10 cases timed out and none finished")
    assert f"{STUCK_AFTER} of {len(default_sweep('batchnorm'))} cases ran" in done.stderr
