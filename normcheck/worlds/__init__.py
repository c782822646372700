"""The world catalogue: where the ranks of a case run (normcheck.worlds.core.World records).

* isolated   — single-process ops, in a worker process of their own (hangs and crashes become rows).
* in-process — single-process ops, in this process.
* lockstep   — ranks are threads of this process meeting at barriers (any W up to 64, empty ranks
  fine); for recipes written against normcheck.kernels.syncbn.collectives.
* gloo       — real torch.distributed over gloo on localhost, persistent worker processes.
* env        — the process group of a launcher (torchrun): this process is one of the ranks.
* lockstep-cuda, lockstep-cuda-normcheck — the lockstep world with every rank's tensors on one
  CUDA device, on torch's CUDA SyncBN primitives or normcheck's.
* jax-devices, tf-devices — every rank a device simulated in one JAX or TensorFlow program (a worker
  process): shard_map over XLA's host devices; MirroredStrategy over logical CPU devices.

Every distributed world runs the framework adapter's run_rank on each rank and assembles the
per-rank outputs (core.assemble) into the outputs compared with the full-batch reference; failures
are described in one vocabulary (failures). Adding a world: a module with its run_ranks, a record here.
"""
from __future__ import annotations

from ..core.errors import UsageError
from ..frameworks.arrays import SIMULATED_DEVICES as MAX_DEVICES
from .core import DEFAULT_TIMEOUT, MAX_WORLD_SIZE, Later, World, assemble, distributed
from .limits import CaseLimit, as_limit

# Each world's code is named and imported when it first runs a case: this catalogue loads no framework (the
# command line checks its arguments, --backend's choices among them, before torch loads)
_EVERY = ("torch", "numpy", "jax", "tf")
_CUDA = "the lockstep world with every rank's tensors on one CUDA device"


def _cuda_missing(backend: str):
    return lambda: Later(f"{__name__}.cuda:cuda_missing")(backend)


WORLDS: dict[str, World] = {w.name: w for w in (
    World("isolated", "a worker process of its own (single-process ops)", False,
          Later(f"{__name__}.inprocess:run_isolated"), ranks="worker", frameworks=_EVERY),
    World("in-process", "this process (single-process ops)", False, Later(f"{__name__}.inprocess:run_here"),
          frameworks=_EVERY),
    World("lockstep", "threads of this process meeting at barriers", True,
          distributed(Later(f"{__name__}.lockstep:cpu_ranks")), ranks="threads", max_size=MAX_WORLD_SIZE),
    World("gloo", "real torch.distributed over gloo on localhost, one persistent process per rank", True,
          distributed(Later(f"{__name__}.gloo:gloo_ranks")), ranks="processes", max_size=8),
    World("env", "the launcher's process group (torchrun): this process is one rank", True,
          distributed(Later(f"{__name__}.env:env_ranks")), ranks="launcher"),
    World("lockstep-cuda", f"{_CUDA}, on torch's CUDA SyncBN primitives", True,
          distributed(Later(f"{__name__}.cuda:torch_ranks")), ranks="threads", max_size=MAX_WORLD_SIZE,
          device="cuda", available=_cuda_missing("lockstep-cuda")),
    World("lockstep-cuda-normcheck", f"{_CUDA}, on normcheck's CUDA SyncBN kernels", True,
          distributed(Later(f"{__name__}.cuda:normcheck_ranks")), ranks="threads", max_size=MAX_WORLD_SIZE,
          device="cuda", available=_cuda_missing("lockstep-cuda-normcheck")),
    World("jax-devices", "JAX's host platform split into CPU devices, shard_map over them in a worker process (one "
          "traced program for every device: a raising or hanging program fails the case, naming no device)", True,
          Later(f"{__name__}.devices:run_devices"), ranks="devices", max_size=MAX_DEVICES, frameworks=("jax",)),
    World("tf-devices", "TensorFlow's CPU split into logical devices, MirroredStrategy over them in a worker process "
          "(a replica that raises is named)", True, Later(f"{__name__}.devices:run_devices"), ranks="devices",
          max_size=MAX_DEVICES, frameworks=("tf",)),
)}

# The worlds a split case can run in: the CLI's --backend choices.
BACKENDS = tuple(name for name, w in WORLDS.items() if w.distributed)


def default_world(distributed: bool, framework: str, preferred: str) -> str:
    """`preferred` (an op's default world) if it runs `framework`'s implementations, else the first world that does."""
    if framework in WORLDS[preferred].frameworks:
        return preferred
    return next((w.name for w in WORLDS.values() if w.distributed == distributed and framework in w.frameworks),
                preferred)


def get_world(name: str) -> World:
    if name not in WORLDS:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return WORLDS[name]


__all__ = ["BACKENDS", "default_world", "DEFAULT_TIMEOUT", "CaseLimit", "WORLDS", "as_limit", "World", "assemble", "get_world"]
