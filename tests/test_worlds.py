"""Template over the world catalogue (WORLDS): in every distributed world this machine can host, a
correct recipe matches the full-batch reference, and a raising, hanging or (where ranks are
processes) dying rank fails the case with a message naming that rank (the torch worlds; those of other
frameworks' simulated devices: tests/test_frameworks.py)."""
from __future__ import annotations

import pytest

from normcheck import WORLDS, Case, UsageError, compare, resolve_impl
from normcheck.engine import FAIL, PASS

FAULTS = "tests._world_faults"
CASE = Case("syncbn", (8, 3, 5), "f64", split=(3, 2, 3))
# (the worlds of devices simulated by JAX and TensorFlow run those frameworks' code: tests/test_frameworks.py)
DISTRIBUTED = [w for w in WORLDS.values() if w.distributed and "torch" in w.frameworks]


def hosted(world):
    """The world, or a skip saying why this machine cannot host it."""
    if world.ranks == "launcher":
        pytest.skip(f"the {world.name} world joins a launcher's process group: "
                    "tests/test_worlds_gloo.py runs it under torchrun")
    why = world.available()
    if why:
        pytest.skip(why)
    return world.name


@pytest.mark.parametrize("world", DISTRIBUTED, ids=lambda w: w.name)
def test_a_correct_recipe_matches_the_full_batch_reference(world):
    report = compare("syncbn", resolve_impl("syncbn", "torch19", hosted(world)), CASE)
    assert report.verdict == PASS, report.summary()


@pytest.mark.parametrize("world", DISTRIBUTED, ids=lambda w: w.name)
def test_a_raising_rank_is_named(world):
    report = compare("syncbn", resolve_impl("syncbn", f"{FAULTS}:raises_on_rank1", hosted(world), 5), CASE)
    assert report.verdict == FAIL
    assert report.message.startswith("rank 1: raised ValueError: rank 1 refuses on purpose"), report.message


@pytest.mark.parametrize("world", DISTRIBUTED, ids=lambda w: w.name)
def test_a_hanging_rank_is_named(world):
    report = compare("syncbn", resolve_impl("syncbn", f"{FAULTS}:hangs_on_rank1", hosted(world), 2), CASE)
    assert report.verdict == FAIL
    assert report.message.startswith("rank 1: timed out after 2 s"), report.message


@pytest.mark.parametrize("world", [w for w in DISTRIBUTED if w.ranks == "processes"], ids=lambda w: w.name)
def test_a_dying_rank_is_named(world):
    report = compare("syncbn", resolve_impl("syncbn", f"{FAULTS}:dies_on_rank1", hosted(world), 5), CASE)
    assert report.verdict == FAIL
    assert report.message.startswith("rank 1: died (exit code 3)"), report.message


@pytest.mark.parametrize("world", [w for w in DISTRIBUTED if w.max_size], ids=lambda w: w.name)
def test_the_size_limit_is_one_line(world):
    size = world.max_size + 1
    case = Case("syncbn", (size, 3, 4), split=(1,) * size)
    impl = resolve_impl("syncbn", "torch19", world.name)
    with pytest.raises(UsageError, match=rf"^world size {size} is outside 1-{world.max_size} for the {world.name} "
                                         "backend$" if not world.available() else "no CUDA device"):
        impl.runner(case, None)


def test_single_process_ops_run_isolated_or_in_this_process_only():
    assert resolve_impl("batchnorm", "torch").world == "isolated"
    assert resolve_impl("batchnorm", "torch", "in-process").world == "in-process"
    with pytest.raises(UsageError, match="batchnorm runs in one process, not the lockstep world"):
        resolve_impl("batchnorm", "torch", "lockstep")


@pytest.mark.parametrize("world", DISTRIBUTED, ids=lambda w: w.name)
def test_a_failure_ends_the_case_while_other_ranks_are_still_busy(world):
    # rank 1 has returned and rank 0 failed while rank 2 still works: the case ends at the failure,
    # not at the 20 s timeout (nor does the wait for rank 2 spin)
    impl = resolve_impl("syncbn", f"{FAULTS}:grad_lost_on_rank0_while_rank2_lingers", hosted(world), 20)
    report = compare("syncbn", impl, CASE)
    assert report.verdict == FAIL and report.message.startswith("rank 0: dweight is None"), report.message
    assert report.seconds < 10
