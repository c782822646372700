"""SyncBatchNorm implementations: the recipes we ship, user functions, and the world each runs in.

An implementation is a `module:attr` spec with the syncbn contract; the backend decides where its
ranks run: `lockstep` (threads, recipes written against our collectives), `gloo` (real
torch.distributed processes; anything, including torch's own Function and user code), `env`
(the launcher's process group, under torchrun), or `lockstep-cuda` / `lockstep-cuda-normcheck`
(the lockstep world with every rank's tensors on one CUDA device, running torch's CUDA SyncBN
primitives / normcheck's; see normcheck.kernels.syncbn.cuda).
"""
from __future__ import annotations

from dataclasses import dataclass

from .cases import Case
from .errors import UsageError
from .known_issues import SYNCBN_EMPTY_RANK_HALF, KnownIssue
from .runners import Runner
from .worlds import assemble

# lockstep world on one CUDA device -> whose CUDA SyncBN primitives the aten ops dispatch to
CUDA_BACKENDS = {"lockstep-cuda": "torch", "lockstep-cuda-normcheck": "normcheck"}
BACKENDS = ("lockstep", "gloo", "env", *CUDA_BACKENDS)
WORLD_LIMITS = {"lockstep": 64, "gloo": 8, **{b: 64 for b in CUDA_BACKENDS}}
DEFAULT_TIMEOUT = 60.0
_RECIPES_MODULE = "normcheck.kernels.syncbn.recipes"


@dataclass(frozen=True)
class Recipe:
    name: str
    spec: str           # module:attr of the function with the syncbn contract
    description: str
    backends: tuple[str, ...]
    default_backend: str
    known_issues: tuple[KnownIssue, ...] = ()
    op: str = "syncbn"


def _recipe(name, module, description, backends=BACKENDS, default="lockstep") -> Recipe:
    # `backends` defaults to every world, the CUDA ones included: recipes allocate on x's device.
    return Recipe(name, f"{_RECIPES_MODULE}.{module}:sync_batch_norm", description, backends, default)


RECIPES = {r.name: r for r in (
    Recipe("torch", f"{_RECIPES_MODULE}.torch_native:sync_batch_norm",
           "torch.nn.modules._functions.SyncBatchNorm as torch ships it, on normcheck's CPU primitives",
           ("gloo", "env"), "gloo", (SYNCBN_EMPTY_RANK_HALF,)),
    _recipe("torch19", "torch19", "torch >= 1.9 style: one combined all_reduce, sums + int32 counts, empty ranks join"),
    _recipe("torch15", "torch15", "torch 1.5-1.8 style: mean_dy = all-reduced sum / total count"),
    _recipe("pre15", "pre15", "pre-1.5 style: per-rank means averaged over the world size (wrong on uneven splits)"),
    _recipe("horovod", "horovod", "Horovod style: separate gathers, two async all_reduces in backward"),
    _recipe("inplace-abn", "inplace_abn", "InplaceABN style: backward recomputes x from y (error grows as |γ| → 0)"),
    _recipe("master-worker", "master_worker",
            "pytorch-syncbn DataParallel protocol: replica threads, master/worker queues", ("lockstep",)),
    Recipe("fused-silu", f"{_RECIPES_MODULE}.fused_silu:sync_batch_norm_silu",
           "fused SyncBN + SiLU; backward recomputes BN(x) instead of saving it", BACKENDS, "lockstep",
           op="syncbn_silu"),
)}


def check_world(case: Case, backend: str) -> None:
    """One-line UsageError when the case's world cannot run on `backend`."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend in CUDA_BACKENDS:
        from .kernels.syncbn.cuda.backend import require_cuda

        require_cuda(backend)
    limit = WORLD_LIMITS.get(backend)
    size = len(case.split)
    if limit is not None and not 1 <= size <= limit:
        raise UsageError(f"world size {size} is outside 1-{limit} for the {backend} backend")


def world_runner(spec: str, backend: str, timeout: float = DEFAULT_TIMEOUT) -> Runner:
    """A runner that runs `spec` on every rank of the case's split and assembles the outputs."""

    def run(case: Case, _inputs) -> dict:
        check_world(case, backend)
        return assemble(case, run_ranks(case, spec, backend, timeout))

    return run


def run_ranks(case: Case, spec: str, backend: str, timeout: float):
    if backend == "lockstep":
        from .registry import load_callable
        from .worlds.lockstep import run_lockstep

        return run_lockstep(case, load_callable(spec), timeout)
    if backend in CUDA_BACKENDS:
        from .kernels.syncbn.cuda.backend import cuda_primitives
        from .registry import load_callable
        from .worlds.lockstep import run_lockstep

        with cuda_primitives(CUDA_BACKENDS[backend]) as device:
            return run_lockstep(case, load_callable(spec), timeout, device)
    if backend == "gloo":
        from .worlds.gloo import get_world

        return get_world(len(case.split), timeout).run(case, spec, timeout)
    return env_world(timeout).run(case, spec)


_ENV_WORLD = []


def env_world(timeout: float = DEFAULT_TIMEOUT):
    """This process's rank in the launcher's process group, joined once per process."""
    if not _ENV_WORLD:
        from .worlds.env import EnvWorld

        _ENV_WORLD.append(EnvWorld.from_environment(timeout=timeout))
    return _ENV_WORLD[0]


def supports(recipe: Recipe, backend: str):
    def check(case: Case) -> str | None:
        if backend not in recipe.backends:
            return f"{recipe.name} runs in the {' or '.join(recipe.backends)} world, not {backend}"
        return None

    return check


def close_env_world() -> None:
    """Leave the launcher's process group cleanly (a gloo group alive at exit aborts the process)."""
    if _ENV_WORLD:
        _ENV_WORLD.pop().close()
