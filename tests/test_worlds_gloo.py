"""The gloo world (real torch.distributed, one process per rank) and the env world (torchrun).

Real processes, no mocks. Worlds take ~2 s to start on 2 cores, so the tests share one world per
size through a module-scoped fixture (``get_world`` keeps them); failure tests run on the size-3
world, which kills its workers after every failure and restarts them for the next case.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from normcheck.cases import Case
from normcheck.reference import batch_norm_backward, batch_norm_forward
from normcheck.core.errors import ImplError, UsageError
from normcheck.worlds import assemble
from normcheck.worlds.env import EnvWorld
from normcheck.worlds.gloo import GlooWorld, get_world

IMPLS = Path(__file__).with_name("_gloo_impls.py")
FAIL_TIMEOUT = 3.0    # per-case timeout for the hang tests
TOLERANCE = 1e-10     # float64, relative to the largest reference magnitude of each output
SEEN_PIDS: set[int] = set()


def spec(name: str) -> str:
    return f"{IMPLS}:{name}"


def pid_gone(pid: int) -> bool:
    """Gone, or a zombie nobody needs to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    alive = [p for p in pids if not pid_gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not pid_gone(p)]
    return alive


def bn_case(split, shape_rest=(4, 4, 4), **kw) -> Case:
    return Case("syncbn", (sum(split),) + tuple(shape_rest), dtype="f64", split=tuple(split), **kw)


def check_against_reference(case: Case, per_rank) -> None:
    """y, dx concatenated over ranks and dweight, dbias summed match the full-batch reference."""
    assert len(per_rank) == len(case.split)
    for r, (out, rows) in enumerate(zip(per_rank, case.split)):
        assert out["y"].shape[0] == rows, f"rank {r} returned {out['y'].shape[0]} rows of y, holds {rows}"
    got = assemble(case, per_rank)
    i = case.make_inputs()
    fwd = batch_norm_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, case.momentum, case.eps)
    bwd = batch_norm_backward(i.dy, i.x, i.weight, case.eps, has_bias=i.bias is not None)
    refs = {"y": fwd.y, "dx": bwd.dx, "dweight": bwd.dweight, "dbias": bwd.dbias,
            "running_mean": fwd.running_mean, "running_var": fwd.running_var}
    for name, ref in refs.items():
        if ref is None:
            assert got.get(name) is None, f"{name}: expected no gradient (affine=False)"
            continue
        err = float(np.abs(got[name] - ref).max() / np.abs(ref).max())
        assert err <= TOLERANCE, f"{case.label}: {name} relative error {err:.3g} > {TOLERANCE:g}"


class _Worlds:
    """world(W): this process's world of W ranks (kept between tests, closed at the end)."""

    def __init__(self):
        self.used: list[GlooWorld] = []

    def __call__(self, size: int) -> GlooWorld:
        w = get_world(size, timeout=30)
        if w not in self.used:
            self.used.append(w)
        return w

    def close(self) -> None:
        for w in self.used:
            w.close()


@pytest.fixture(scope="module")
def world():
    worlds = _Worlds()
    yield worlds
    worlds.close()


def run(world: GlooWorld, case: Case, name: str = "sync_bn", **kw):
    out = world.run(case, spec(name), **kw)
    SEEN_PIDS.update(world.pids)
    return out


# ----------------------------------------------------------------------------- correctness
@pytest.mark.parametrize("split, kw", [
    ((5,), {}),
    ((3, 5), {}),
    ((0, 6), {"affine": False}),
    ((3, 0, 5), {}),
    ((3, 0, 5), {"x_format": "channels_last"}),
    ((4, 1, 0, 3), {"x_format": "channels_last", "dy_format": "contiguous"}),
    ((2, 3, 1, 4), {"shape_rest": (3, 7)}),
], ids=lambda v: ",".join(map(str, v)) if isinstance(v, tuple) else "-".join(f"{k}={v[k]}" for k in v) or "plain")
def test_gloo_world_matches_the_full_batch_reference(world, split, kw):
    case = bn_case(split, **kw)
    check_against_reference(case, run(world(len(split)), case))


def test_workers_are_reused_across_cases(world):
    w = world(2)
    w.start()
    pids, starts = w.pids, w.starts
    for seed in range(12):
        split = [(3, 5), (8, 0), (1, 1)][seed % 3]
        case = bn_case(split, shape_rest=(3, 2 + seed % 3, 3), seed=seed)
        check_against_reference(case, run(w, case))
    assert w.pids == pids and w.starts == starts, "workers were restarted between successful cases"


def test_bad_spec_or_case_is_a_usage_error_and_keeps_the_world(world):
    w = world(2)
    w.start()
    pids = w.pids
    with pytest.raises(ValueError, match="cannot import no_such_module_for_normcheck"):
        w.run(bn_case((3, 5)), "no_such_module_for_normcheck:fn")
    with pytest.raises(ValueError, match=r"is for 3 ranks; this gloo world has 2"):
        w.run(bn_case((3, 0, 5)), spec("sync_bn"))
    with pytest.raises(ValueError, match="no split"):
        w.run(Case("batchnorm", (8, 4, 4, 4), dtype="f64"), spec("sync_bn"))
    assert w.pids == pids


def test_module_specs_resolve_against_the_parents_directory(world, monkeypatch):
    w = world(1).start()  # started before the chdir below: workers follow the parent's directory
    monkeypatch.chdir(IMPLS.parent.parent)
    case = bn_case((6,), seed=3)
    check_against_reference(case, w.run(case, "tests._gloo_impls:sync_bn"))
    monkeypatch.chdir(IMPLS.parent)
    check_against_reference(case, w.run(case, "_gloo_impls.py:sync_bn"))  # relative file path


# ----------------------------------------------------------------------------- failures
def _fails_then_recovers(w: GlooWorld, impl: str, pattern: str, timeout: float | None = None) -> float:
    case = bn_case((3, 0, 5))
    w.start()
    old = w.pids
    SEEN_PIDS.update(old)
    t0 = time.monotonic()
    with pytest.raises(ImplError) as info:
        w.run(case, spec(impl), timeout=timeout)
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert re.fullmatch(pattern, message), message
    assert "\n" not in message
    assert w.pids == [] and all(pid_gone(p) for p in old), "a failed world's workers must all be gone"
    check_against_reference(case, run(w, case))  # a fresh world, started on demand
    assert set(w.pids).isdisjoint(old)
    return elapsed


@pytest.mark.parametrize("impl, pattern", [
    ("raises_on_rank2", r"rank 2: raised ValueError: rank 2 refuses on purpose \(at _gloo_impls.py:\d+ in raises_on_rank2\)"),
    ("raises_everywhere", r"ranks 0, 1, 2: raised NotImplementedError: no kernel for torch.float64 "
                          r"\(at _gloo_impls.py:\d+ in raises_everywhere\)"),
    ("dies_on_rank1", r"rank 1: died \(exit code 3\)"),
    ("wrong_shape_on_rank0", r"rank 0: y has shape \(3, 3, 4, 4\), expected \(3, 4, 4, 4\)"),
], ids=["raises", "raises-everywhere", "dies", "wrong-shape"])
def test_a_failing_rank_is_named_and_the_world_restarts(world, impl, pattern):
    _fails_then_recovers(world(3), impl, pattern)


def test_a_rank_that_hangs_before_a_collective_times_out(world):
    elapsed = _fails_then_recovers(
        world(3), "hangs_on_rank1",
        r"rank 1: timed out after 3 s at _gloo_impls\.py:\d+ in hangs_on_rank1; ranks 0, 2 waiting in all_gather",
        timeout=FAIL_TIMEOUT)
    # The contract is "never hang the parent": the failure comes at the timeout, plus the time to
    # ask the ranks where they are (<= 1 s) and kill them.
    assert FAIL_TIMEOUT <= elapsed < FAIL_TIMEOUT + 5, elapsed


def test_a_rank_that_hangs_after_the_collectives_times_out(world):
    elapsed = _fails_then_recovers(
        world(3), "hangs_after_collectives_on_rank1",
        r"rank 1: timed out after 3 s at _gloo_impls\.py:\d+ in backward \(other ranks finished: 0, 2\)",
        timeout=FAIL_TIMEOUT)
    assert FAIL_TIMEOUT <= elapsed < FAIL_TIMEOUT + 5, elapsed


# ----------------------------------------------------------------------------- worlds and processes
def test_get_world_keeps_one_world_per_size_and_replaces_a_closed_one():
    get_world(6).close()  # (another test file run by this worker process may have started a world of 6)
    a = get_world(6)  # workers start on first use only: no processes here
    assert get_world(6) is a and a.pids == []
    a.close()
    b = get_world(6)
    assert b is not a and not b.closed
    b.close()
    with pytest.raises(ValueError, match="closed"):
        a.run(bn_case((1,) * 6), spec("sync_bn"))


def test_two_worlds_alive_at_once_use_different_ports(world):
    a = world(1).start()
    with GlooWorld(1) as b:  # a second world of the same size, next to the shared one
        b.start()
        assert a.port != b.port and world(2).start().port not in (a.port, b.port)
        case = bn_case((4,))
        for _ in range(2):
            check_against_reference(case, run(a, case))
            check_against_reference(case, run(b, case))
        pids = b.pids
    assert b.closed and b.pids == [] and all(pid_gone(p) for p in pids)
    b.close()  # idempotent
    check_against_reference(case, run(a, case))  # closing one world leaves the other alone


_ORPHAN_SCRIPT = """
import os, signal, sys
from normcheck.worlds.gloo import GlooWorld
if __name__ == "__main__":
    w = GlooWorld(2).start()
    print(" ".join(map(str, w.pids)), flush=True)
    if sys.argv[1] == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit: the workers must notice on their own
    # "exit": leave without close(); atexit closes the world
"""


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_worker_outlives_its_parent(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_SCRIPT)
    done = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120,
                          check=False)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    assert done.returncode == (0 if how == "exit" else -signal.SIGKILL), done.stderr
    assert wait_gone(pids) == [], f"workers {pids} outlived their parent ({how})"


# ----------------------------------------------------------------------------- env world
def test_env_world_needs_the_launcher_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"^--backend env needs RANK and WORLD_SIZE set, e\.g\. by torchrun$"):
        EnvWorld.from_environment()


_TORCHRUN_SCRIPT = """
import json, sys
import numpy as np
from normcheck.cases import Case
from normcheck.reference import batch_norm_backward, batch_norm_forward
import torch

from normcheck.core.errors import ImplError, UsageError
from normcheck.worlds import assemble
from normcheck.worlds.env import EnvWorld

impls = sys.argv[1]
world = EnvWorld.from_environment(timeout=5)  # (joining waits for both ranks' start-up: 2 s timed out under load)
case = Case("syncbn", (7, 3, 4, 4), dtype="f64", x_format="channels_last", split=(5, 2), seed=4)
per_rank = world.run(case, impls + ":sync_bn")
result = {"rank": world.rank, "got_list": per_rank is not None}
if world.rank == 0:
    out, i = assemble(case, per_rank), case.make_inputs()
    f = batch_norm_forward(i.x, i.weight, i.bias, i.running_mean, i.running_var, case.momentum, case.eps)
    b = batch_norm_backward(i.dy, i.x, i.weight, case.eps)
    refs = dict(y=f.y, dx=b.dx, dweight=b.dweight, dbias=b.dbias, running_var=f.running_var)
    result["errors"] = {k: float(np.abs(out[k] - r).max() / np.abs(r).max()) for k, r in refs.items()}
try:  # rank 1 raises while rank 0 waits in all_gather (until the 5 s collective timeout)
    world.run(case, impls + ":raises_on_rank1")
except ImplError as e:
    result["failure"] = str(e)
with open(f"{sys.argv[2]}/rank{world.rank}.json", "w") as f:
    json.dump(result, f)
world.close()
"""


def test_env_world_under_torchrun(tmp_path):
    script = tmp_path / "env_check.py"
    script.write_text(_TORCHRUN_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
         str(IMPLS), str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    results = {r["rank"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("rank*.json"))}
    assert done.returncode == 0 and set(results) == {0, 1}, done.stdout + done.stderr
    assert results[0]["got_list"] and not results[1]["got_list"]
    for name, err in results[0]["errors"].items():
        assert err <= TOLERANCE, f"{name}: relative error {err:.3g} under torchrun"
    for r in (0, 1):  # every rank learns the same outcome, naming the rank that raised
        assert re.fullmatch(r"rank 1: raised ValueError: rank 1 refuses on purpose \(at _gloo_impls.py:\d+ in raises_on_rank1\)",
                            results[r]["failure"]), results[r]["failure"]


# ----------------------------------------------------------------------------- last: nothing left
def test_nothing_left_behind_after_closing_every_world(world):
    assert len(SEEN_PIDS) >= 20, "the tests above recorded too few worker pids"
    world.close()
    # (Only this module's workers: another module's session-wide world may legitimately be alive.)
    assert [p for p in multiprocessing.active_children() if p.pid in SEEN_PIDS] == []
    assert [p for p in SEEN_PIDS if not pid_gone(p)] == []


def test_env_world_under_nccl_needs_cuda_and_says_so_in_one_line(monkeypatch):
    """$NORMCHECK_ENV_BACKEND=nccl (how `normcheck compare --backend env` reaches NCCL under torchrun) on a machine
    whose torch sees no GPU: one line, before any process group is joined."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: scripts/gpu_check.sh runs NCCL under torchrun where it has two GPUs")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999",
                       "NORMCHECK_ENV_BACKEND": "nccl"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match=r"^--backend env with nccl needs CUDA, and torch sees no GPU here$"):
        EnvWorld.from_environment()
    monkeypatch.setenv("NORMCHECK_ENV_BACKEND", "mpi")
    with pytest.raises(UsageError, match="unknown backend 'mpi' for the env world; choose gloo or nccl"):
        EnvWorld.from_environment()
