"""Cases per second through a warm gloo world (start-up excluded), small SyncBN cases.

Each round runs one case (forward + backward on every rank, outputs sent back to the parent);
the OPS column of pytest-benchmark is cases/s. Target: >= 20 cases/s on 2 cores for W = 2..4.
With --benchmark-disable (the repo default) each body runs once and checks the result.

    pytest benchmarks/test_gloo_world_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from normcheck.cases import Case
from normcheck.reference import batch_norm_backward, batch_norm_forward
from normcheck.worlds import assemble
from normcheck.worlds.gloo import GlooWorld

SPEC = f"{Path(__file__).resolve().parents[1] / 'tests' / '_gloo_impls.py'}:sync_bn"
SPLITS = {2: (3, 5), 4: (3, 0, 4, 1)}  # uneven, with an empty rank for W=4


@pytest.fixture(scope="module")
def worlds():
    made = {size: GlooWorld(size) for size in SPLITS}
    yield made
    for w in made.values():
        w.close()


@pytest.mark.parametrize("size", sorted(SPLITS))
def test_cases_per_second(benchmark, worlds, size):
    world = worlds[size].start()
    base = Case("syncbn", (8, 4, 5, 5), dtype="f64", split=SPLITS[size])
    world.run(base, SPEC)  # warm: the workers load the implementation and run their first case
    seeds = itertools.count(1)
    benchmark.group = "gloo world, 8x4x5x5 f64"
    benchmark.extra_info["world_size"] = size

    def one_case():
        case = base.with_(seed=next(seeds))  # a new case every round (inputs differ)
        return case, world.run(case, SPEC)

    case, per_rank = benchmark(one_case)
    out, i = assemble(case, per_rank), case.make_inputs()
    ref = batch_norm_backward(i.dy, i.x, i.weight, case.eps).dx
    assert np.abs(out["dx"] - ref).max() <= 1e-10 * np.abs(ref).max()
    assert np.abs(out["y"] - batch_norm_forward(i.x, i.weight, i.bias, eps=case.eps).y).max() <= 1e-10
