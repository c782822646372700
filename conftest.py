"""Shared pytest setup: hypothesis profiles (DESIGN.md: ci, dev, thorough; normcheck/hypothesis_settings.py).

`ci` is the default: derandomized with a fixed budget, so the gate is reproducible. Choose another
with `pytest --hypothesis-profile=dev` (random, more examples) or `thorough` (many more).
"""
import os

# Two gate workers (pytest -n 2) share two cores with the isolated worker processes they start; OpenMP's threads
# (torch's intra-op pool) spin for a while after each parallel region by default, taking the cores the other
# processes need: the same tests took 49 s side by side against 20 s alone, 26 s with passive waits. Waiting
# passively changes no thread count and so no kernel path. (Set before anything loads torch, here and in every
# process started from here.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# NumPy's OpenBLAS (the float64 reference's and the tolerance model's dot products) starts a thread per core too,
# and two processes' pools on two cores contend the same way: one thread each, 57-63 s -> 48 s for four ops' template
# sweeps judged in two processes side by side. (The reference's sums are float64: how many threads split a dot
# product moves its last bits only, far inside every budget, as on a machine with another number of cores.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from hypothesis import settings  # noqa: E402

from normcheck.cases.budgets import register_profiles  # noqa: E402

register_profiles()
settings.load_profile(os.environ.get("NORMCHECK_HYPOTHESIS_PROFILE", "ci"))

# The gate's files in the order its two workers should start them (pytest-xdist's loadfile hands files out in
# collection order once its own reordering, by number of tests, is off: pytest_configure): the one that mostly waits
# (a hanging implementation's time limits) first, so that the other worker fills the wait, then the longer ones,
# longest first (the usual greedy schedule), so that the last minutes are short files on both workers rather than
# one long file on one of them. xdist's own order put the one-test files last: the 30 s wait ran at the end.
FIRST = ("tests/test_stuck.py", "tests/test_impls.py", "tests/test_frameworks.py", "tests/test_conventions.py",
         "tests/test_ops.py", "tests/test_pytest_plugin.py", "tests/test_readme.py", "tests/test_isolation.py",
         "tests/test_interrupts.py", "tests/test_narrowing.py", "tests/test_parallel.py", "tests/test_worlds_gloo.py",
         "tests/test_properties.py", "tests/test_cli.py", "tests/test_worlds.py", "tests/test_syncbn_cli.py",
         "tests/test_progress.py", "tests/test_layernorm_gate.py", "tests/test_layer_classes.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # (pytest-xdist: sorts files by their number of tests)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return FIRST.index(path) if path in FIRST else len(FIRST)
    items.sort(key=rank)  # (stable: the rest keep their order)
