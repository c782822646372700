"""Parallel norms (normcheck.ops.parallel, layouts in normcheck.ops.layouts): the layouts' shards and assembly, the
textbook recipes in the lockstep and gloo worlds, what the mutants' failures say, deadlocks, the CLI.

The default sweeps of the textbooks and of every mutant run in tests/test_ops.py and tests/test_impls.py (lockstep);
here the gloo world runs a few cases (one world per size, started once), and DTensor's records (torch's sharding
propagation) a slice of their sweeps on torch.chunk's splits.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from normcheck import IMPLS
from normcheck.cases import Case
from normcheck.cases.narrowing import Narrowing
from normcheck.cases.sweep import default_sweep, design, sweep_levels
from normcheck.cli import main
from normcheck.core.errors import ImplError, UsageError
from normcheck.engine import FAIL, KNOWN, PASS, judge
from normcheck.impls import resolve_impl
from normcheck.ops.dtensor import RMS_NORM_EVEN_HIDDEN_SHARD, chunk_split
from normcheck.worlds import CaseLimit, assemble
from tests.mutants import CATALOGUE

ROOT = Path(__file__).resolve().parents[1]
PARALLEL_OPS = ("layernorm_sp", "rmsnorm_sp", "layernorm_hp", "rmsnorm_hp", "add_layernorm_sp", "add_rmsnorm_sp")


def bound(op: str, impl, backend: str = "lockstep"):
    return resolve_impl(op, impl, backend, CaseLimit(20.0, "--timeout"))


# ----------------------------------------------------------------------------- layouts
def test_hidden_parallel_ranks_hold_slices_of_x_and_gamma():
    case = Case("layernorm_hp", (3, 16), "f64", split=(5, 0, 11))
    x, gamma = np.arange(48.0).reshape(3, 16), np.arange(16.0)
    data, params = case.rank_shard(2)
    assert np.array_equal(x[data], x[:, 5:]) and np.array_equal(gamma[params], gamma[5:])
    assert x[case.rank_shard(1)[0]].shape == (3, 0) and case.rank_offset(2) == 5


def test_sequence_parallel_ranks_hold_rows_and_all_of_gamma():
    case = Case("rmsnorm_sp", (8, 3, 7), "f64", split=(0, 3, 5))
    x, gamma = np.zeros((8, 3, 7)), np.arange(7.0)
    data, params = case.rank_shard(2)
    assert x[data].shape == (5, 3, 7) and np.array_equal(gamma[params], gamma) and case.rank_offset(2) == 3


def test_hidden_parallel_outputs_are_joined_along_the_hidden_dim():
    case = Case("layernorm_hp", (2, 5), "f64", split=(2, 0, 3))
    full = {"y": np.arange(10.0).reshape(2, 5), "dweight": np.arange(5.0) + 10}
    ranks = [{"y": full["y"][:, :2], "dweight": full["dweight"][:2]}, {"y": np.zeros((2, 0)), "dweight": None},
             {"y": full["y"][:, 2:], "dweight": full["dweight"][2:]}]
    out = assemble(case, ranks)
    assert np.array_equal(out["y"], full["y"]) and np.array_equal(out["dweight"], full["dweight"])


def test_a_replicated_gradient_that_differs_names_the_ranks_and_by_how_much():
    case = Case("layernorm_sp", (6, 4), "f64", split=(2, 2, 2))
    same, off = np.ones(4), np.array([1.0, 1.0, 1.5, 1.0])
    ranks = [{"y": np.zeros((2, 4)), "dweight": g, "dbias": np.ones(4)} for g in (same, off, same)]
    with pytest.raises(ImplError, match=r"dweight is not the same on every rank.*ranks 0, 2's: rank 1 by up to 0\.5"):
        assemble(case, ranks)


def test_without_reduces_grads_the_world_sums_the_partial_gradients():
    case = Case("layernorm_sp", (6, 4), "f64", split=(2, 2, 2), reduces_grads="no")
    ranks = [{"y": np.zeros((2, 4)), "dweight": np.full(4, r + 1.0), "dbias": np.ones(4)} for r in range(3)]
    assert np.array_equal(assemble(case, ranks)["dweight"], np.full(4, 6.0))


@pytest.mark.parametrize("kw, message", [
    (dict(op="layernorm_hp", shape=(2, 16), split=(7, 8)), "sums to 15, not H=16"),
    (dict(op="rmsnorm_sp", shape=(4, 16), split=(1, 2)), "sums to 3, not N=4"),
    (dict(op="layernorm_hp", shape=(2, 3, 4), split=(6, 6), normalized_dims=2), "--normalized-dims 1"),
    (dict(op="layernorm", shape=(2, 16), reduces_grads="no"),
     "reduces-grads applies to layernorm_sp, rmsnorm_sp, add_layernorm_sp and add_rmsnorm_sp only"),
])
def test_bad_parallel_cases_are_one_line(kw, message):
    with pytest.raises(UsageError, match=message) as e:
        Case(**kw)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- textbooks and mutants
GLOO_CASES = [Case("layernorm_sp", (6, 2, 64), "bf16", "f32", split=(2, 0, 4)),
              Case("rmsnorm_sp", (5, 33), "f32", split=(5, 0)),
              Case("layernorm_hp", (4, 33), "f32", split=(10, 0, 23)),
              Case("rmsnorm_hp", (3, 40), "bf16", split=(0, 17, 23)),
              Case("add_rmsnorm_sp", (7, 2, 48), "bf16", split=(3, 0, 4), residual_dtype="f32")]


@pytest.mark.parametrize("case", GLOO_CASES, ids=lambda c: c.op)
def test_the_textbooks_pass_in_the_gloo_world(case):
    report = judge(case, bound(case.op, "textbook", "gloo"))
    assert report.verdict == PASS, report.summary()


@pytest.mark.parametrize("op, bug, case, named", [
    ("layernorm_sp", "no_grad_reduction", Case("layernorm_sp", (8, 16), "f32", split=(3, 5)), r"rank 1 by up to"),
    ("rmsnorm_sp", "grad_reduced_on_rank_0_only", Case("rmsnorm_sp", (9, 16), "f32", split=(1, 4, 4)),
     r"differs from rank 0's: rank 1 by up to .*; rank 2 by up to"),
    ("layernorm_hp", "local_statistics", Case("layernorm_hp", (4, 16), "f32", split=(0, 5, 11)), r"on rank [12]"),
    ("rmsnorm_hp", "gamma_at_even_offset", Case("rmsnorm_hp", (4, 16), "f32", split=(0, 5, 11)), r"y on rank 1"),
    ("add_layernorm_sp", "residual_on_rank_0_only", Case("add_layernorm_sp", (6, 16), "f32", split=(2, 4)),
     r"rank 1: dresidual is None"),  # (rank 1's h = x: the residual never reached)
    ("add_rmsnorm_sp", "stream_detached", Case("add_rmsnorm_sp", (6, 16), "f32", split=(2, 0, 4)), r"on rank [02]"),
])
def test_a_mutant_fails_naming_the_rank(op, bug, case, named):
    report = judge(case, bound(op, CATALOGUE[op].MUTANTS[bug]))
    assert report.verdict == FAIL and re.search(named, report.message), report.message


def test_a_gradient_averaged_instead_of_summed_fails_on_its_size():
    case = Case("layernorm_sp", (8, 16), "f32", split=(3, 5))
    report = judge(case, bound("layernorm_sp", CATALOGUE["layernorm_sp"].MUTANTS["grad_mean_not_sum"]))
    got = re.match(r"d(weight|bias): .*got (\S+), expected (\S+),", report.message)
    assert report.verdict == FAIL and got, report.message
    assert float(got[2]) / float(got[3]) == pytest.approx(1 / 2, rel=1e-3)  # the sum over 2 ranks, halved


def test_a_mutant_fails_in_the_gloo_world_too():
    report = judge(Case("rmsnorm_sp", (9, 16), "f32", split=(1, 4, 4)),
                   bound("rmsnorm_sp", "tests.mutants.rmsnorm_sp:grad_reduced_on_rank_0_only", "gloo"))
    assert report.verdict == FAIL and "differs from rank 0's: rank 1 by up to" in report.message, report.message


def skips_reduction_when_empty(input, normalized_shape, weight, bias, eps, process_group, world_size, offset):
    """A sequence-parallel LayerNorm whose empty ranks skip the gradient all-reduce: their peers wait for ever."""
    import torch.nn.functional as F
    from normcheck.kernels.parallel.reductions import reduce_gradient
    if input.shape[0] == 0:
        return F.layer_norm(input, normalized_shape, weight, bias, eps)
    return F.layer_norm(input, normalized_shape, reduce_gradient(weight, process_group),
                        reduce_gradient(bias, process_group), eps)


@pytest.mark.parametrize("backend", ["lockstep", "gloo"])
def test_a_rank_that_skips_the_reduction_ends_the_case_in_seconds(backend):
    case = Case("layernorm_sp", (5, 16), "f32", split=(2, 0, 3))
    start = time.monotonic()
    report = judge(case, bound("layernorm_sp", f"{__name__}:skips_reduction_when_empty", backend))
    assert report.verdict == FAIL and "rank 1" in report.message, report.message
    assert time.monotonic() - start < 15, report.message


# ----------------------------------------------------------------------------- the command line
def test_compare_runs_a_textbook_and_a_mutant_from_the_command_line(capsys):
    out = io.StringIO()
    assert main(["compare", "--one-case", "--op", "rmsnorm_hp", "--split", "7,0,9", "--dtype", "bf16"], out) == 0, out.getvalue()
    assert "split=7,0,9" in out.getvalue() and "1 passed" in out.getvalue()
    out = io.StringIO()
    code = main(["compare", "--one-case", "--op", "layernorm_sp", "--impl", "tests.mutants.layernorm_sp:no_grad_reduction",
                 "--split", "3,0,5", "--shape", "8,32"], out)
    assert code == 1 and "dweight is not the same on every rank" in out.getvalue(), out.getvalue()


def test_every_parallel_op_has_a_textbook_and_mutants():
    for op in PARALLEL_OPS:
        assert bound(op, "textbook").name == "textbook" and CATALOGUE[op].MUTANTS


def test_an_add_norms_stream_is_sharded_like_x_and_joined_with_its_gradient():
    case = Case("add_layernorm_sp", (5, 4), "f64", split=(2, 0, 3), affine=False)
    assert case.record.x_shaped_outputs(case) == ("y", "dx", "h", "dresidual")
    full = {name: np.arange(20.0).reshape(5, 4) + k for k, name in enumerate(("y", "dx", "h", "dresidual"))}
    ranks = [{name: a[rows] for name, a in full.items()} for rows in (slice(0, 2), slice(2, 2), slice(2, 5))]
    out = assemble(case, ranks)
    assert all(np.array_equal(out[name], full[name]) for name in full)
    # the form that returns y alone has no h to join
    assert "h" not in case.with_(returns="y").record.x_shaped_outputs(case.with_(returns="y"))


# ----------------------------------------------------------------------------- DTensor: torch's sharding propagation
DTENSOR = [(op, name) for op in PARALLEL_OPS for name in ("dtensor", "dtensor-replicate") if name in IMPLS[op]]


def test_chunk_split_is_torch_chunks_shares():
    for extent, ranks in ((e, r) for e in range(20) for r in range(1, 9)):
        shares = [len(part) for part in torch.arange(extent).chunk(ranks)]
        assert chunk_split(extent, ranks) == tuple(shares + [0] * (ranks - len(shares)))


def test_a_dtensor_records_sweep_takes_torch_chunks_shares_and_other_splits_skip_saying_why():
    impl = bound("layernorm_sp", "dtensor", "gloo")
    sweep = default_sweep("layernorm_sp", follows=impl.impl.follows, shares=impl.impl.shares)
    assert [c.split for c in sweep] == [chunk_split(c.shape[0], len(c.split)) for c in sweep]
    assert {len(c.split) for c in sweep} == {len(c.split) for c in default_sweep("layernorm_sp")}  # the same worlds
    assert any(0 in c.split for c in sweep)  # (torch.chunk leaves the last ranks empty when the rows run out)
    assert all(impl.unsupported(c) is None for c in sweep)
    why = impl.unsupported(Case("layernorm_sp", (8, 16), "f32", split=(3, 5)))
    assert why.startswith("dtensor splits 8 over 2 ranks as 4,4 only (DTensor places torch.chunk's shares"), why


@pytest.mark.parametrize("op, name", DTENSOR)
def test_dtensor_records_pass_or_are_known_over_a_slice_of_their_sweep(op, name):
    """torch's own sharding propagation and DTensor's backward, in gloo worlds of 1-8 ranks, on every fourth case of
    its covering design (torch.chunk's shares): PASS, or KNOWN by a recorded signature (docs/usage.md's parallel
    norms). (Its boundary scans keep the usual split, one rank holding the whole row: an even shard torch's rms_norm
    cannot take, so every rmsnorm_hp scan case is KNOWN; so are most of its class triples' cases, whose hidden sizes
    are mostly even: the slice is of the covering array's rows.)"""
    impl = bound(op, name, "gloo")
    narrowing = Narrowing(scans="without")
    rows = len(design(op, sweep_levels(narrowing.with_fields(impl.impl.follows))))
    reports = [judge(case, impl) for case in default_sweep(op, follows=impl.impl.follows, shares=impl.impl.shares,
                                                             narrowing=narrowing)[:rows:4]]
    assert not [r.summary() for r in reports if r.verdict == FAIL]
    assert sum(r.verdict == PASS for r in reports) >= len(reports) // 2


def test_dtensors_rms_norm_on_equal_hidden_shares_is_a_known_torch_issue_and_excuses_no_other_code():
    case = Case("rmsnorm_hp", (4, 16), "f32", split=(8, 8))
    assert RMS_NORM_EVEN_HIDDEN_SHARD.applies(case)
    report = judge(case, bound("rmsnorm_hp", "dtensor", "gloo"))
    assert report.verdict == KNOWN and RMS_NORM_EVEN_HIDDEN_SHARD.key in report.message, report.message
    # torch.chunk's unequal shares are gathered first and pass; the same code given as a user's is not excused
    assert judge(Case("rmsnorm_hp", (4, 15), "f32", split=(8, 7)), bound("rmsnorm_hp", "dtensor", "gloo")).verdict == PASS
    users = judge(case, bound("rmsnorm_hp", "normcheck.ops.dtensor:rms_norm_hidden", "gloo"))
    assert users.verdict == FAIL and "aten.add_.Scalar" in users.message, users.message


def test_a_dtensor_record_runs_under_torchrun_in_the_env_world():
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "normcheck",
         "compare", "--one-case", "--op", "layernorm_sp", "--backend", "env", "--impl", "dtensor", "--split", "4,4", "--cases", "2"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "KNOWN"))]
    assert len(rows) == 2 and all(r.startswith("PASS") and "split=4,4" in r for r in rows)  # rank 0 reports


def test_a_layout_given_as_the_backend_runs_the_ops_parallel_op(capsys):
    out = io.StringIO()
    assert main(["compare", "--one-case", "--op", "layernorm", "--backend", "sequence-parallel", "--impl", "textbook",
                 "--split", "3,0,5", "--shape", "8,32"], out) == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("layernorm_sp / textbook: 1 cases: 1 passed")
    out = io.StringIO()
    assert main(["compare", "--one-case", "--op", "rmsnorm", "--backend", "hidden-parallel", "--impl",
                 "tests.mutants.rmsnorm_hp:gamma_at_even_offset", "--split", "0,5,11", "--shape", "4,16"], out) == 1
    assert "y on rank 1" in out.getvalue()
    assert main(["compare", "--op", "batchnorm", "--backend", "sequence-parallel"], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err == ("normcheck: error: --backend sequence-parallel lays out layernorm (layernorm_sp), rmsnorm "
                   "(rmsnorm_sp), add_layernorm (add_layernorm_sp), add_rmsnorm (add_rmsnorm_sp), not batchnorm\n")
