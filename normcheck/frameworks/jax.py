"""The JAX adapter: a case's inputs as jax arrays (x64 on, so f64 means f64), the op's array contract under
`jax.jit`, gradients through `jax.vjp` (order 2: the vjp of the vjp; forward mode: `jax.jvp`, fwd-rev the jvp of the
vjp), outputs back as float64 NumPy.

A world of devices is simulated in this process: XLA's host platform is given SIMULATED_DEVICES CPU devices before
JAX starts, and SyncBN runs under `shard_map` over the first W of them, each device's rows padded to the
largest share with a row mask (the documented way to give a device fewer rows; an empty device holds only
padding). Each device's own gradients of the replicated γ and β come back separately (the world sums them).
"""
from __future__ import annotations

from functools import lru_cache

import jax

from ..core.errors import UsageError
from .arrays import (COTANGENT_OF, SIMULATED_DEVICES, array_names, cotangents_of, data_operands, forward,
                     master_arrays, row_arrays, to_outputs)


jax.config.update("jax_enable_x64", True)  # f64 cases are f64 (JAX's default would make them f32)
try:
    jax.config.update("jax_num_cpu_devices", SIMULATED_DEVICES)
except RuntimeError:  # JAX already started in this process: the devices it has are the devices there are
    pass

import jax.numpy as jnp  # noqa: E402 - after the configuration above
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

KERNELS = frozenset({"jax"})  # what known issues of JAX's kernels follow (KnownIssue.code)
AXIS = "devices"  # the mesh axis SyncBN reduces over


def run(op, bound, case, inputs):
    """One process: forward and backward of the bound record's function under the op's array contract."""
    arrays = master_arrays(inputs)
    step = _step(bound.impl.callable(), case)
    out = jax.device_get(step(_device_args(arrays, None)))
    return to_outputs(op, case, out, arrays["x"].shape), bound.impl.reported_path(case), KERNELS


def run_devices(op, bound, case, inputs) -> list[dict[str, np.ndarray]]:
    """Every device of the case's world: shard_map over W simulated devices; one outputs dict per device."""
    size = len(case.split)
    devices = jax.devices("cpu")
    if size > len(devices):
        raise UsageError(f"world size {size} needs {size} simulated devices; JAX has {len(devices)} here "
                         f"(it started before normcheck could ask for {SIMULATED_DEVICES})")
    rows = max(max(case.split), 1)
    starts = np.cumsum((0,) + case.split)
    shares = [master_arrays(inputs, slice(starts[r], starts[r + 1])) for r in range(size)]
    padded = {name: _pad_stack([s[name] for s in shares], rows) for name in row_arrays(case)}
    mask = np.zeros((size * rows,), dtype=bool)
    for r, n in enumerate(case.split):
        mask[r * rows: r * rows + n] = True
    arrays = {**shares[0], **padded, "mask": mask}
    step = _step(bound.impl.callable(), case, devices=True)
    out = jax.device_get(step(_device_args(arrays, _shardings(case))))
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


def _device_args(arrays: dict, shardings: dict | None) -> dict:
    """The arrays on the devices, each placed where the step reads it (shardings: a device world's, by name; None: the
    default device). device_put copies from the host; jnp.asarray would compile a program per shape (lax.stage),
    and an array on one device would be resliced onto the mesh by another (_multi_slice)."""
    return {k: None if v is None else jax.device_put(v, None if shardings is None else shardings[k])
            for k, v in arrays.items()}


@lru_cache(maxsize=None)
def _mesh(size: int) -> Mesh:
    """The first `size` devices as the AXIS mesh (one per world size: shard_map's and the inputs' shardings)."""
    return Mesh(np.array(jax.devices("cpu")[:size]), (AXIS,))


def _specs(case) -> dict:
    """Each array's PartitionSpec in a device world: the row arrays (and the mask) split by rows, the others
    replicated."""
    by_rows = set(row_arrays(case)) | {"mask"}
    return {name: PartitionSpec(AXIS) if name in by_rows else PartitionSpec()
            for name in (*array_names(case), "mask")}


def _shardings(case) -> dict:
    mesh = _mesh(len(case.split))
    return {name: NamedSharding(mesh, spec) for name, spec in _specs(case).items()}


@lru_cache(maxsize=2)  # judge runs a case twice: the second run reuses the compiled step
def _step(fn, case, devices: bool = False):
    """The jitted forward + backward of `fn` on `case` (under shard_map over the world's devices), of a dict of
    arrays (master_arrays', and a device world's row mask)."""
    op = case.record
    mesh = _mesh(len(case.split)) if devices else None
    ndim = len(case.shape)
    wrt = op.gradients  # gradient name -> the input it is taken of

    def step(a):
        given = {name: a[name] for name in ("x", "weight", "bias", *data_operands(case))}
        row_mask = None if a.get("mask") is None else a["mask"].reshape((-1,) + (1,) * (ndim - 1))

        def primal(leaves):
            b = {**given, **{wrt[g]: v for g, v in leaves.items()}}
            return forward(op, fn, case, b["x"], b["weight"], b["bias"], a["running_mean"], a["running_var"],
                           row_mask, AXIS if mesh is not None else None, {n: b[n] for n in data_operands(case)})

        def first(leaves, dy):
            results, pullback, stats = jax.vjp(primal, leaves, has_aux=True)
            given_cotangents = cotangents_of(case, {**a, "dy": dy})  # (a result without one pulls back zeros)
            cotangents = {k: given_cotangents.get(k, jnp.zeros_like(v)) for k, v in results.items()}
            return pullback(cotangents)[0], (results, stats)

        if case.forward_mode:
            out = forward_mode(primal, first, a, {g: given[wrt[g]] for g in case.differentiated})
        else:
            leaves = {g: given[wrt[g]] for g in case.grads}
            grads, (results, stats) = first(leaves, a["dy"])
            out = {**results, **grads, **stats}
        if case.order == 2:  # (ops with directional derivatives: x, γ and β are their only leaves)
            cotangents = {g: a[COTANGENT_OF[g]] for g in leaves}
            _, pullback = jax.vjp(lambda l, d: first(l, d)[0], leaves, a["dy"])
            d_leaves, d_dy = pullback(cotangents)
            second = {"d2x": d_leaves.get("dx"), "d2weight": d_leaves.get("dweight"), "d2dy": d_dy}
            out.update({k: second[k] for k in case.directional})
        if mesh is not None:  # each device's own parameter gradients and running statistics, stacked
            out = {k: v if k in op.x_shaped else v[None] for k, v in out.items()}
        return out

    def forward_mode(primal, first, a, leaves):
        """The outputs and (fwd-rev) gradients with their tangents along the case's directions, through jax.jvp (of
        the forward; fwd-rev: of the vjp, forward-over-reverse)."""
        tangents = {g: a[COTANGENT_OF[g]] for g in leaves}
        if case.order == "fwd":
            (results, stats), (d_results, _) = jax.jvp(primal, (leaves,), (tangents,))
            grads, d_grads = {}, {}
        else:
            (grads, (results, stats)), (d_grads, (d_results, _)) = jax.jvp(
                lambda l: first(l, a["dy"]), (leaves,), (tangents,))
        d_outputs = {**d_results, **d_grads}
        return {**results, **grads, **stats, **{k: d_outputs[p] for k, p in case.tangents.items()}}

    if mesh is None:
        return jax.jit(step)
    mapped = jax.shard_map(step, mesh=mesh, in_specs=(_specs(case),), out_specs=PartitionSpec(AXIS), check_vma=False)
    return jax.jit(mapped)
