"""Worlds: where the ranks of a SyncBN case run.

* lockstep — ranks are threads of this process meeting at barriers (any W, empty ranks fine);
  for recipes written against normcheck.kernels.syncbn.collectives.
* gloo     — real torch.distributed over gloo on localhost, persistent worker processes.
* env      — the process group of a launcher (torchrun): this process is one of the ranks.

Every world runs normcheck.worlds.rank.run_rank on each rank and returns the per-rank outputs;
`assemble` turns them into the outputs compared with the full-batch reference.
"""
from __future__ import annotations

import torch

from ..cases import Case
from ..runners import ImplError
from .rank import RankOutputs


def assemble(case: Case, per_rank: list[RankOutputs]) -> dict[str, torch.Tensor | None]:
    """y and dx concatenated over ranks; dweight/dbias summed (a rank's None counts as zero);
    running stats from rank 0, plus `running_mean[rank r]` for every rank that disagrees with
    rank 0, so those are compared with the reference too."""
    out: dict[str, torch.Tensor | None] = {
        "y": torch.cat([r["y"] for r in per_rank]),
        "dx": torch.cat([r["dx"] for r in per_rank]),
    }
    for name in ("dweight", "dbias"):
        if not case.affine:
            continue
        grads = [r.get(name) for r in per_rank]
        for rank, (g, rows) in enumerate(zip(grads, case.split)):
            if g is None and rows > 0:
                raise ImplError(f"rank {rank}: {name} is None: no gradient reaches that input")
        present = [g for g in grads if g is not None]
        out[name] = torch.stack(present).sum(0).to(present[0].dtype) if present else None
    for name in ("running_mean", "running_var"):
        out[name] = per_rank[0][name]
        for rank, r in enumerate(per_rank[1:], start=1):
            if not torch.equal(r[name], out[name]):
                out[f"{name}[rank {rank}]"] = r[name]
    return out
