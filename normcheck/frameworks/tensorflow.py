"""The TensorFlow adapter: a case's inputs as tf tensors, the op's array contract run eagerly, gradients through
`tf.GradientTape` (order 2: a tape around the tape; forward mode: `tf.autodiff.ForwardAccumulator`, around the tape
for fwd-rev), outputs back as float64 NumPy.

A world of devices is simulated in this process: TensorFlow's CPU is split into SIMULATED_DEVICES logical
devices before it starts, and SyncBN runs under `tf.distribute.MirroredStrategy` over the first W of them,
each replica holding exactly its own rows (replicas may differ in size; an empty one holds none). Each
replica's own gradients of the replicated γ and β come back separately (the world sums them).
"""
from __future__ import annotations

import contextlib
import os
from functools import lru_cache

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # (before TensorFlow starts: its C++ start-up chatter)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ..core.errors import ImplError, UsageError  # noqa: E402
from ..core.text import exception_text, raised_at  # noqa: E402
from .arrays import (COTANGENT_OF, SIMULATED_DEVICES, cotangents_of, data_operands, forward,  # noqa: E402
                     master_arrays, to_outputs)

try:
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * SIMULATED_DEVICES)
except RuntimeError:  # TensorFlow already started in this process: the devices it has are the devices there are
    pass
tf.get_logger().setLevel("ERROR")  # (eager MirroredStrategy warns that it is slower than under tf.function)
KERNELS = frozenset({"tensorflow"})  # what known issues of TensorFlow's kernels follow (KnownIssue.code)


def run(op, bound, case, inputs):
    """One process: forward and backward of the bound record's function under the op's array contract."""
    arrays = master_arrays(inputs)
    out = _step(op, bound.impl.callable(), case, _tensors(arrays))
    return to_outputs(op, case, _numpy(out), arrays["x"].shape), bound.impl.reported_path(case), KERNELS


def run_devices(op, bound, case, inputs) -> list[dict[str, np.ndarray]]:
    """Every replica of the case's world under MirroredStrategy; one outputs dict per replica."""
    size = len(case.split)
    strategy = _strategy(size)
    starts = np.cumsum((0,) + case.split)
    shares = [master_arrays(inputs, slice(starts[r], starts[r + 1])) for r in range(size)]
    fn = bound.impl.callable()
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: _tensors(shares[ctx.replica_id_in_sync_group]))
    out = strategy.run(lambda t: _replica_step(op, fn, case, t), args=(values,))
    per_replica = []
    for r, n in enumerate(case.split):
        mine = {k: strategy.experimental_local_results(v)[r] for k, v in out.items()}
        per_replica.append(to_outputs(op, case, _numpy(mine), (n,) + shares[0]["x"].shape[1:]))
    return per_replica


def _replica_step(op, fn, case, t: dict) -> dict:
    """_step on one replica; what it raises names the replica (they run in threads of their own)."""
    rank = int(tf.distribute.get_replica_context().replica_id_in_sync_group)
    try:
        return _step(op, fn, case, t)
    except ImplError as e:
        raise ImplError(f"rank {rank}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the implementation raised: a finding, named by its replica
        raise ImplError(f"rank {rank}: {exception_text(e)}{raised_at(e)}") from e


@lru_cache(maxsize=None)
def _strategy(size: int) -> tf.distribute.MirroredStrategy:
    devices = tf.config.list_logical_devices("CPU")
    if size > len(devices):
        raise UsageError(f"world size {size} needs {size} logical devices; TensorFlow has {len(devices)} here "
                         f"(it started before normcheck could ask for {SIMULATED_DEVICES})")
    return tf.distribute.MirroredStrategy([d.name for d in devices[:size]],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


def _tensors(arrays: dict) -> dict:
    return {k: tf.constant(v) for k, v in arrays.items() if v is not None}


def _numpy(out: dict) -> dict:
    return {k: None if v is None else v.numpy() for k, v in out.items()}


def _step(op, fn, case, t: dict) -> dict:
    """y and the op's declared results, the gradients the case asks for (every result with its cotangent) and
    (order 2) the second-order ones, on one replica's tensors; in forward mode under a ForwardAccumulator."""
    if case.forward_mode:
        return _forward_mode(op, fn, case, t)
    x, dy = t["x"], t["dy"]
    leaves = {g: t[op.gradients[g]] for g in case.grads}
    second = case.order == 2
    with tf.GradientTape() if second else contextlib.nullcontext() as outer:
        if second:
            outer.watch([*leaves.values(), dy])
        out = _first_order(op, fn, case, t, leaves)
    if second:  # (ops with directional derivatives: x, γ and β are their only leaves)
        wrt = {"d2x": t["x"], "d2weight": t.get("weight"), "d2dy": dy}
        wanted = {k: wrt[k] for k in case.directional}
        cotangents = [t[COTANGENT_OF[g]] for g in leaves]
        d2 = outer.gradient([out[g] for g in leaves], list(wanted.values()), output_gradients=cotangents)
        out.update({k: tf.zeros_like(v) if g is None else g for (k, v), g in zip(wanted.items(), d2)})
    return out


def _first_order(op, fn, case, t: dict, leaves: dict) -> dict:
    """The forward and the gradients of `leaves` through a GradientTape (every result with its cotangent)."""
    with tf.GradientTape() as tape:
        tape.watch(list(leaves.values()))
        results, stats = forward(op, fn, case, t["x"], t.get("weight"), t.get("bias"), t["running_mean"],
                                 t["running_var"], extra={n: t[n] for n in data_operands(case)})
    cotangents = cotangents_of(case, t)
    grads = tape.gradient([results[k] for k in cotangents], list(leaves.values()),
                          output_gradients=list(cotangents.values())) if leaves else []
    out = {**results, **stats}
    for name, grad in zip(leaves, grads):
        if grad is None and t["x"].shape[0]:
            raise ImplError(f"{name} is None: no gradient reaches that input")
        out[name] = tf.zeros_like(leaves[name]) if grad is None else grad
    return out


def _forward_mode(op, fn, case, t: dict) -> dict:
    """The outputs with their tangents along the case's directions under a ForwardAccumulator (fwd-rev: around the
    GradientTape of the backward, forward-over-reverse)."""
    leaves = {g: t[op.gradients[g]] for g in case.differentiated}
    tangents = [t[COTANGENT_OF[g]] for g in leaves]
    with tf.autodiff.ForwardAccumulator(list(leaves.values()), tangents) as accumulator:
        out = _first_order(op, fn, case, t, leaves if case.order == "fwd-rev" else {})
    for name, primal in case.tangents.items():
        tangent = accumulator.jvp(out[primal])
        out[name] = tf.zeros_like(out[primal]) if tangent is None else tangent
    return out
