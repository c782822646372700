"""torch's DTensor as the implementation of the parallel norms: F.layer_norm / F.rms_norm on DTensors over a
DeviceMesh of the world's process group, torch's sharding propagation being the code under test.

Each rank wraps its shard as DTensor.from_local with the placements of its layout, calls the functional op, and
returns its share of y as the contract asks (redistributing where torch's strategy placed y otherwise); backward is
DTensor's own: a replicated γ's gradient comes back from from_local as Partial and is all-reduced there (the
reduces_grads convention).

* rows      — sequence-parallel: x Shard(0), γ and β Replicate().
* hidden    — hidden-parallel: x Shard(-1), γ and β Shard(0) (the strategy gathers the normalised dim and y comes
              back Replicate: it is redistributed to Shard(-1)).
* replicate — sequence-parallel too: x redistributed from Shard(0) to Replicate() before the norm (an all-gather,
           its backward a reduce-scatter) and y back to Shard(0).

DTensor places torch.chunk's shares of a sharded dim and no others (pytorch/pytorch#144109: from_local accepts
other uneven shards, then redistributing them is silently wrong or aborts gloo), so the records declare those shares
(Impl.shares): their sweeps take them, and a case with other shares is a SKIP saying so.
"""
from __future__ import annotations

import math

from .core import Impl, KnownIssue, Signature


def chunk_split(extent: int, ranks: int) -> tuple[int, ...]:
    """torch.chunk's shares of `extent` over `ranks`: ceil(extent / ranks) each, the rest on the last, then none."""
    size = math.ceil(extent / ranks) if extent else 0
    return tuple(max(0, min(size, extent - size * r)) for r in range(ranks))


def _placed(local, mesh, placement, whole_shape):
    from torch.distributed.tensor import DTensor
    if local is None:
        return None
    return DTensor.from_local(local, mesh, [placement], run_check=False, shape=whole_shape,
                              stride=_contiguous_strides(whole_shape))


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _whole_rows(input, group) -> int:
    """The rows of the whole x: a rank knows only its own (from_local must be told the global shape of an uneven
    shard), so the ranks sum their counts."""
    import torch
    import torch.distributed as dist
    count = torch.tensor([input.shape[0]], dtype=torch.int64, device=input.device)
    dist.all_reduce(count, group=group)
    return int(count.item())


def _norm(kind: str, layout: str):
    """The contract function of `kind` (layer_norm, rms_norm) laid out as `layout`: rows, hidden or replicate (the
    module's docstring)."""
    def norm(input, normalized_shape, weight, *rest):
        import torch.nn.functional as F
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Replicate, Shard

        bias, (eps, group, world_size, offset) = (rest[0], rest[1:]) if kind == "layer_norm" else (None, rest)
        mesh = DeviceMesh.from_group(group, input.device.type)
        last = input.dim() - 1
        if layout == "hidden":  # x's last dim and γ, β sharded
            x = _placed(input, mesh, Shard(last), tuple(input.shape[:-1]) + tuple(normalized_shape))
            params = [_placed(p, mesh, Shard(0), tuple(normalized_shape)) for p in (weight, bias)]
            out = Shard(last)
        else:  # the rows sharded, γ, β replicated
            x = _placed(input, mesh, Shard(0), (_whole_rows(input, group),) + tuple(input.shape[1:]))
            params = [_placed(p, mesh, Replicate(), tuple(normalized_shape)) for p in (weight, bias)]
            out = Shard(0)
            if layout == "replicate":
                x = x.redistribute(mesh, [Replicate()])
        if kind == "layer_norm":
            y = F.layer_norm(x, normalized_shape, params[0], params[1], eps)
        else:
            y = F.rms_norm(x, normalized_shape, params[0], eps)
        return y.redistribute(mesh, [out]).to_local()
    norm.__name__ = f"{kind}_{layout}"
    return norm


layer_norm_rows = _norm("layer_norm", "rows")
layer_norm_replicate = _norm("layer_norm", "replicate")
layer_norm_hidden = _norm("layer_norm", "hidden")
rms_norm_rows = _norm("rms_norm", "rows")
rms_norm_replicate = _norm("rms_norm", "replicate")
rms_norm_hidden = _norm("rms_norm", "hidden")


RMS_NORM_EVEN_HIDDEN_SHARD = KnownIssue(
    "torch-dtensor-rms-norm-even-hidden-shard",
    "F.rms_norm on a DTensor whose normalised dim is Shard()-ed in equal shares (a world of one included) raises: "
    "its composite computes mean(x²) as Partial(avg) and adds eps in place (aten.add_.Scalar), which DTensor refuses; "
    "unequal (torch.chunk) shares are gathered first and pass",
    lambda c: c.split is not None and len(set(c.split)) == 1,
    Signature(message=r"aten\.add_\.Scalar: in-place operations that require placement changes are not supported"),
)


def records(op: str, kind: str, layout_axis: str, follows: dict, known_issues=()) -> tuple:
    """The DTensor records of the parallel op `op` (its base op's functional `kind`), by its layout's axis."""
    def record(name: str, layout: str, placements: str) -> Impl:
        return Impl(name, op, f"torch.nn.functional.{kind} on DTensors over a DeviceMesh of the world's group: "
                    f"{placements} (torch's sharding propagation and DTensor's backward)",
                    f"normcheck.ops.dtensor:{kind}_{layout}", world="gloo", worlds=("gloo", "env"),
                    shares=chunk_split, shares_why="DTensor places torch.chunk's shares of a sharded dim and no "
                    "others, pytorch/pytorch#144109", capabilities="torch.chunk's splits (DTensor's uneven sharding)",
                    modes=("train",), orders=(1,), follows=follows, known_issues=known_issues)

    if layout_axis == "hidden":
        if kind == "rms_norm":
            known_issues = known_issues + (RMS_NORM_EVEN_HIDDEN_SHARD,)
        return (record("dtensor", "hidden", "x Shard(-1), γ and β Shard(0); y redistributed to Shard(-1)"),)
    return (record("dtensor", "rows", "x Shard(0), γ and β Replicate()"),
            record("dtensor-replicate", "replicate", "x from Shard(0) redistributed to Replicate(), γ and β "
                   "Replicate(); y redistributed to Shard(0)"))
