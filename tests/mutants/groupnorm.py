"""GroupNorm mutants: the textbook implementation with one bug each.

They have F.group_norm's signature, so each also works as
`normcheck compare --op groupnorm --impl tests.mutants.groupnorm:interleaved_groups`.
"""
from __future__ import annotations

from .textbook import group_norm, named

BUGS = ("unbiased_normalise", "naive_variance", "low_precision_accumulation", "drop_xhat_term",
        "ignore_strides", "gamma_outside_group_sums", "bf16_moments", "eps_outside_sqrt",
        "interleaved_groups", "modifies_input", "dweight_missing_invstd",
        "constant_stats_double_backward", "overwrites_dy", "frozen_x_fast_path", "frozen_params_fast_path",
        "nondeterministic_sum",
        # on the paths kernels dispatch on: one set, a long set, channel lanes, G = 1 and G = C, eps, momentum
        "g1_per_pixel", "gc_drops_bias", "long_set_halves",
        # on one size path of a tiled kernel, where only the boundary scans reach (plane size, batch)
        "plane_tile_tail", "unrolled_batch_tail",
        # on paths nobody named: the data pointer's alignment, a size table's 5·2^j entries
        "vec8_path_last_vector", "table_5x_entry")
MUTANTS = {bug: named(group_norm, bug) for bug in BUGS}
textbook = group_norm()
tiled_sums = named(group_norm, "tiled_sums")  # (correct: statistics merged from tiles)
dispatched_paths = named(group_norm, "dispatched_paths")  # (correct: a size table's entries merged from their chunks)
CORRECT = {"textbook": textbook, "tiled_sums": tiled_sums, "dispatched_paths": dispatched_paths}
globals().update(MUTANTS)
