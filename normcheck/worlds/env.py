"""The env world: under a launcher (torchrun), this process IS one rank of the case.

    # torchrun --nproc-per-node 4 check.py
    world = EnvWorld.from_environment()
    per_rank = world.run(case, "my_syncbn:fn")   # the list on rank 0, None on the other ranks

Every process of the job calls ``run`` with the same case; each runs
``normcheck.worlds.rank.run_rank`` for its own rank, then the outcome is exchanged on a separate
gloo group (the control group): if any rank failed, every rank raises the same ImplError naming
the rank(s) and the cause; otherwise rank 0 receives every rank's outputs (as CPU tensors).

A process cannot kill its peers, so there is no per-case timeout here: a rank that hangs is caught
only by the process groups' timeouts (`timeout` for the cases' collectives, twice that plus 30 s
for the control group), and the peers then raise from a collective rather than naming the rank.
A rank that raises while its peers wait in a collective is reported once the peers' collective
times out. After any failure the default group may be unusable (a collective left stranded): run
no further cases in that job.
"""
from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..cases import Case
from ..core.errors import ImplError, Unsupported, UsageError
from ..core.loading import load_callable
from ..frameworks.torch import run_rank
from ..kernels.syncbn import cpu_primitives
from .core import DEFAULT_TIMEOUT, CaseLimit, RankOutputs, positive_seconds
from .failures import declined, describe_failures, failure_of

__all__ = ["EnvWorld", "close_env_world", "env_world"]

_NEEDS_ENV = "--backend env needs RANK and WORLD_SIZE set, e.g. by torchrun"


class EnvWorld:
    """This process's rank in the default process group of a launcher-started job."""

    def __init__(self, rank: int, world_size: int, group=None, control_group=None, owns_group: bool = False,
                 device: torch.device | None = None):
        self.rank = rank
        self.device = device  # where this rank's tensors live: its GPU under NCCL, the CPU (None) under gloo
        self.world_size = world_size
        self.group = group if group is not None else dist.group.WORLD
        self._control = control_group
        self._owns_group = owns_group
        self._fns: dict[str, Callable] = {}

    @classmethod
    def from_environment(cls, backend: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> EnvWorld:
        """Join the default process group (initialising it from RANK, WORLD_SIZE, MASTER_ADDR and
        MASTER_PORT when nobody has yet). `backend`: None or "gloo" (CPU), or "nccl" (needs CUDA;
        each rank then uses the GPU LOCAL_RANK, its tensors there). None: $NORMCHECK_ENV_BACKEND where the launcher's
        environment sets it (how the CLI's `--backend env` reaches NCCL), else gloo. `timeout` bounds every collective
        in seconds."""
        missing = [k for k in ("RANK", "WORLD_SIZE") if not os.environ.get(k)]
        if missing:
            raise UsageError(_NEEDS_ENV)
        backend = backend or os.environ.get("NORMCHECK_ENV_BACKEND") or None
        if backend not in (None, "gloo", "nccl"):
            raise UsageError(f"unknown backend {backend!r} for the env world; choose gloo or nccl")
        timeout = positive_seconds(timeout, "timeout")
        cpu_primitives.register()
        delta = datetime.timedelta(seconds=timeout)
        owns = False
        if not dist.is_initialized():
            for key in ("MASTER_ADDR", "MASTER_PORT"):
                if not os.environ.get(key):
                    raise UsageError(f"--backend env needs {key} set as well (torchrun sets it)")
            backend = backend or "gloo"
            if backend == "nccl":
                if not torch.cuda.is_available():
                    raise UsageError("--backend env with nccl needs CUDA, and torch sees no GPU here")
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, init_method="env://", timeout=delta)
            owns = True
        rank, size = dist.get_rank(), dist.get_world_size()
        if (rank, size) != (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])):
            raise UsageError(f"the initialised process group is rank {rank} of {size}, but the environment "
                             f"says RANK={os.environ['RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']}")
        # Outcomes travel on their own gloo group, with a longer timeout than the cases' collectives:
        # an exchange there is never matched with a collective an implementation left stranded.
        control = dist.new_group(backend="gloo", timeout=2 * delta + datetime.timedelta(seconds=30))
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        return cls(rank, size, dist.group.WORLD, control, owns, device)

    def run(self, case: Case, impl_spec: str) -> list[RankOutputs] | None:
        """Run this rank's part of `case`; every rank's outputs on rank 0, None elsewhere."""
        if not isinstance(case, Case) or case.split is None:
            raise UsageError("the env world needs a Case with a split (per-rank batch sizes)")
        if len(case.split) != self.world_size:
            raise UsageError(f"case split {case.split} is for {len(case.split)} ranks; this job has "
                             f"{self.world_size} (WORLD_SIZE)")
        fn = self._fns.get(impl_spec)
        if fn is None:
            fn = self._fns[impl_spec] = load_callable(impl_spec)
        outputs: RankOutputs | None = None
        try:
            outputs = run_rank(case.record, fn, case, case.make_inputs(), self.rank, self.group, self.world_size,
                               self.device)
            status = None
        except Exception as e:  # noqa: BLE001 - every rank must reach the exchange below
            status = failure_of(e)
        statuses: list = [None] * self.world_size
        dist.all_gather_object(statuses, status, group=self._control)
        failures = {r: s for r, s in enumerate(statuses) if s is not None}
        reason = declined(failures, self.world_size)
        if reason is not None:  # (every rank declined the case: a SKIP)
            raise Unsupported(reason)
        if failures:
            raise ImplError(describe_failures(failures))
        gathered: list | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(outputs, gathered, dst=0, group=self._control)
        return gathered

    def close(self) -> None:
        """Destroy the groups this world created (the default group only if it initialised it)."""
        if self._control is not None and dist.is_initialized():
            dist.destroy_process_group(self._control)
            self._control = None
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def __enter__(self) -> EnvWorld:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_ENV_WORLD: list[EnvWorld] = []


def env_world(timeout: float | None = None) -> EnvWorld:
    """This process's rank in the launcher's process group, joined once per process; `timeout`
    bounds its collectives (None: DEFAULT_TIMEOUT)."""
    if not _ENV_WORLD:
        _ENV_WORLD.append(EnvWorld.from_environment(timeout=DEFAULT_TIMEOUT if timeout is None else timeout))
    return _ENV_WORLD[0]


def close_env_world() -> None:
    """Leave the launcher's process group cleanly (a gloo group alive at exit aborts the process)."""
    if _ENV_WORLD:
        _ENV_WORLD.pop().close()


def env_ranks(bound, case: Case, inputs, limit: CaseLimit) -> list[RankOutputs]:
    """The env World's run_ranks. The job's process groups were made with one timeout (an explicit
    limit, else the default), which bounds each collective; the limit here only measures."""
    world = env_world(limit.fixed)
    return limit.run(case, lambda timeout: world.run(case, bound.impl.spec))
