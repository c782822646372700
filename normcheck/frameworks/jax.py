"""The JAX adapter: a case's inputs as jax arrays (x64 on, so f64 means f64), the op's array contract under
`jax.jit`, gradients through `jax.vjp` (order 2: the vjp of the vjp), outputs back as float64 NumPy.

A world of devices is simulated in this process: XLA's host platform is given SIMULATED_DEVICES CPU devices before
JAX starts, and SyncBN runs under `shard_map` over the first W of them, each device's rows padded to the
largest share with a row mask (the documented way to give a device fewer rows; an empty device holds only
padding). Each device's own gradients of the replicated γ and β come back separately (the world sums them).
"""
from __future__ import annotations

from functools import lru_cache

import jax

from ..core.errors import UsageError
from .arrays import COTANGENT_OF, INPUT_OF, SIMULATED_DEVICES, forward, master_arrays, to_outputs


jax.config.update("jax_enable_x64", True)  # f64 cases are f64 (JAX's default would make them f32)
try:
    jax.config.update("jax_num_cpu_devices", SIMULATED_DEVICES)
except RuntimeError:  # JAX already started in this process: the devices it has are the devices there are
    pass

import jax.numpy as jnp  # noqa: E402 - after the configuration above
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

KERNELS = frozenset({"jax"})  # what known issues of JAX's kernels follow (KnownIssue.code)
AXIS = "devices"  # the mesh axis SyncBN reduces over


def run(op, impl, case, inputs):
    """One process: forward and backward of impl's function under the op's array contract."""
    arrays = master_arrays(inputs)
    step = _step(impl.callable(), case)
    out = jax.device_get(step(*_device_args(arrays)))
    return to_outputs(op, case, out, arrays["x"].shape), impl.reported_path(case), KERNELS


def run_devices(op, impl, case, inputs) -> list[dict[str, np.ndarray]]:
    """Every device of the case's world: shard_map over W simulated devices; one outputs dict per device."""
    size = len(case.split)
    devices = jax.devices("cpu")
    if size > len(devices):
        raise UsageError(f"world size {size} needs {size} simulated devices; JAX has {len(devices)} here "
                         f"(it started before normcheck could ask for {SIMULATED_DEVICES})")
    rows = max(max(case.split), 1)
    starts = np.cumsum((0,) + case.split)
    shares = [master_arrays(inputs, slice(starts[r], starts[r + 1])) for r in range(size)]
    padded = {name: _pad_stack([s[name] for s in shares], rows) for name in ("x", "dy", "ddx")}
    mask = np.zeros((size * rows,), dtype=bool)
    for r, n in enumerate(case.split):
        mask[r * rows: r * rows + n] = True
    arrays = {**shares[0], **padded, "mask": mask}
    step = _step(impl.callable(), case, devices=True)
    out = jax.device_get(step(*_device_args(arrays)))
    per_device = []
    for r, n in enumerate(case.split):
        mine = {name: _share(name, value, r, rows, n, op) for name, value in out.items()}
        per_device.append(to_outputs(op, case, mine, (n,) + arrays["x"].shape[1:]))
    return per_device


def _pad_stack(parts, rows: int):
    if parts[0] is None:
        return None
    return np.concatenate([np.concatenate([p, np.zeros((rows - len(p),) + p.shape[1:], p.dtype)]) for p in parts])


def _share(name: str, value, rank: int, rows: int, n: int, op):
    """Device `rank`'s part of a stacked output: its real rows of an x-shaped one, its own of the others."""
    if value is None:
        return None
    if name in op.x_shaped:
        return value[rank * rows: rank * rows + n]
    return value[rank]


_ARGS = ("x", "dy", "weight", "bias", "running_mean", "running_var", "ddx", "ddweight", "ddbias", "mask")


def _device_args(arrays: dict) -> list:
    return [None if arrays.get(k) is None else jnp.asarray(arrays[k]) for k in _ARGS]


@lru_cache(maxsize=2)  # judge runs a case twice: the second run reuses the compiled step
def _step(fn, case, devices: bool = False):
    """The jitted forward + backward of `fn` on `case` (under shard_map over the world's devices)."""
    op = case.record
    mesh = Mesh(np.array(jax.devices("cpu")[:len(case.split)]), (AXIS,)) if devices else None
    ndim = len(case.shape)
    leaves_of = [g for g in INPUT_OF if g in case.grads]

    def step(x, dy, weight, bias, running_mean, running_var, ddx, ddweight, ddbias, mask):
        given = {"x": x, "weight": weight, "bias": bias}

        def primal(leaves):
            a = {**given, **{INPUT_OF[g]: v for g, v in leaves.items()}}
            row_mask = None if mask is None else mask.reshape((-1,) + (1,) * (ndim - 1))
            return forward(op, fn, case, a["x"], a["weight"], a["bias"], running_mean, running_var, row_mask,
                           AXIS if mesh is not None else None)

        def first(leaves, dy):
            y, pullback, stats = jax.vjp(primal, leaves, has_aux=True)
            return pullback(dy)[0], (y, stats)

        leaves = {g: given[INPUT_OF[g]] for g in leaves_of}
        grads, (y, stats) = first(leaves, dy)
        out = {"y": y, **grads, **stats}
        if case.order == 2:
            given_cotangents = {"ddx": ddx, "ddweight": ddweight, "ddbias": ddbias}
            cotangents = {g: given_cotangents[COTANGENT_OF[g]] for g in leaves_of}
            _, pullback = jax.vjp(lambda l, d: first(l, d)[0], leaves, dy)
            d_leaves, d_dy = pullback(cotangents)
            second = {"d2x": d_leaves.get("dx"), "d2weight": d_leaves.get("dweight"), "d2dy": d_dy}
            out.update({k: second[k] for k in case.second_order})
        if mesh is not None:  # each device's own parameter gradients and running statistics, stacked
            out = {k: v if k in op.x_shaped else v[None] for k, v in out.items()}
        return out

    if mesh is None:
        return jax.jit(step)
    P = PartitionSpec
    rows = P(AXIS)
    in_specs = (rows, rows, P(), P(), P(), P(), rows, P(), P(), rows)
    mapped = jax.shard_map(step, mesh=mesh, in_specs=in_specs, out_specs=rows, check_vma=False)
    return jax.jit(mapped)

