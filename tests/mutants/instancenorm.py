"""InstanceNorm mutants: the textbook implementation with one bug each, from the bug classes of real
InstanceNorm kernels (the variance formula and its bias, half-precision sums, a dropped term, strides,
eps placement, the momentum convention, running statistics that are not the batch average of the
per-instance ones, batch statistics instead of per-instance ones, inputs overwritten).

They have F.instance_norm's signature, so each also works as
`normcheck compare --op instancenorm --impl tests.mutants.instancenorm:running_var_pooled`.
"""
from __future__ import annotations

from .textbook import instance_norm, named

BUGS = ("unbiased_normalise", "naive_variance", "low_precision_accumulation", "drop_xhat_term", "biased_running_var",
        "ignore_strides", "bf16_moments", "eps_outside_sqrt", "momentum_swapped", "modifies_input",
        "dweight_missing_invstd", "low_precision_param_sums", "batch_statistics", "running_var_pooled",
        "eval_uses_batch_stats", "eval_updates_running_stats", "constant_stats_double_backward", "overwrites_dy", "frozen_x_fast_path", "frozen_params_fast_path",
        "nondeterministic_sum")
MUTANTS = {bug: named(instance_norm, bug) for bug in BUGS}
textbook = instance_norm()
CORRECT = {"textbook": textbook}
globals().update(MUTANTS)
