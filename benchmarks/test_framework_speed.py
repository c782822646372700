"""What a case costs on the other frameworks' records, side by side with torch's eager one: LayerNorm cases
(3x4x2x3, bf16 input, f32 parameters), a new seed each round (new values: what a sweep's next case of the same
guards costs), judged by torch, torch.compile (after its first compile: the compiled code reused, nothing
recompiled), flax (jax.jit: each new case a trace and compile of its own) and Keras (eager TensorFlow). One
group: read the ratios.

    pytest benchmarks/test_framework_speed.py --benchmark-enable -p no:cacheprovider
"""
from __future__ import annotations

from itertools import count

import pytest

from normcheck import Case, IMPLS
from normcheck.engine import FAIL, judge
from normcheck.frameworks import FRAMEWORKS
from normcheck.impls import resolve_impl

CASE = Case("layernorm", (3, 4, 2, 3), "bf16", "f32", normalized_dims=2)
WARM = Case("layernorm", (5, 7, 2, 3), "bf16", "f32", normalized_dims=2)  # the same guards: compiles what CASE reuses


@pytest.mark.parametrize("name", ["torch", "torch-compile", "flax", "keras"])
def test_one_layernorm_case(benchmark, name):
    record = IMPLS["layernorm"][name]
    if FRAMEWORKS.missing(record.framework):
        pytest.skip(FRAMEWORKS.missing(record.framework))
    if name == "torch-compile" and benchmark.disabled:
        pytest.skip("its first compile takes ~20 s; run with --benchmark-enable (tests/test_compiled.py covers it)")
    impl = resolve_impl("layernorm", record)
    judge(WARM, impl)  # the worker started, the framework imported, torch.compile's code compiled
    benchmark.group = "layernorm 3x4x2x3 bf16/f32: one case per framework"

    seeds = count(1)

    def once():
        return judge(CASE.with_(seed=next(seeds)), impl)

    assert benchmark(once).verdict != FAIL
