"""normcheck's GroupNorm kernel in its cache: a build stopped by Ctrl-C or a kill leaves nothing that blocks a later
run, and a cache that cannot be written is one line naming it (never a case that times out or FAILs)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from normcheck.kernels.groupnorm.loader import BuildError, _build_lock, build_dir, load

ROOT = Path(__file__).resolve().parents[1]


def _load_in(cache: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    code = "from normcheck.kernels.groupnorm.loader import load; print(load().__file__)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "NORMCHECK_CACHE": str(cache)})


def test_a_build_lock_a_stopped_build_left_does_not_block_a_later_load(tmp_path):
    built = Path(load().__file__).parent  # (built by CI before the tests, or now)
    copy = tmp_path / "cache" / built.relative_to(build_dir().parents[1])
    shutil.copytree(built, copy)
    (copy / "lock").write_text("")  # what torch's build leaves when its process is stopped mid-build
    start = time.monotonic()
    done = _load_in(tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == copy and time.monotonic() - start < 60


def test_the_build_lock_is_the_operating_systems_and_goes_with_a_killed_holder(tmp_path):
    (tmp_path / "lock").write_text("")  # torch's file lock of a build that was stopped
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from normcheck.kernels.groupnorm.loader import _build_lock\n"
        f"with _build_lock(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not (tmp_path / "lock").exists()  # (no builder held it: the holder of the OS lock removed it)
        import fcntl
        with open(tmp_path / "build.flock", "a") as handle:
            with pytest.raises(BlockingIOError):  # (held while its holder lives)
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.kill()
        holder.wait(timeout=30)
        (tmp_path / "lock").write_text("")  # (as the killed holder's build would have left it)
        with _build_lock(tmp_path):  # (the kill released it: no wait)
            assert not (tmp_path / "lock").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # (a cache root under a file: no directory can be made there, root or not)
    monkeypatch.setenv("NORMCHECK_CACHE", str(blocked / "cache"))
    from normcheck.kernels.groupnorm import loader
    monkeypatch.setattr(loader, "_module", None)
    with pytest.raises(BuildError) as raised:
        loader.load()
    message = str(raised.value)
    assert "\n" not in message and str(blocked / "cache") in message and "NORMCHECK_CACHE" in message


def test_a_kernel_that_cannot_be_built_stops_the_run_in_one_line_not_a_fail_per_case(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    done = subprocess.run([sys.executable, "-m", "normcheck", "compare", "--op", "groupnorm", "--impl", "cl-auto-t1",
                           "--one-case", "--shape", "2,6,3,3", "--memory-format", "channels_last", "--cases", "3"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "NORMCHECK_CACHE": str(blocked / "cache")})
    assert done.returncode == 2 and "FAIL" not in done.stdout, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"normcheck: error: normcheck's GroupNorm kernel is built into {blocked / 'cache'}"), done.stderr
