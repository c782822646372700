"""LayerNorm mutants: the textbook implementation with one bug each, from the bug classes of real
LayerNorm kernels (statistics and parameter-gradient sums in half precision, a dropped term,
strides, eps placement, the variance formula, saved statistics rounded, inputs overwritten), and the fp8 output's
(tests/mutants/_fp8.py: Impl records following fp8=e4m3 or e5m2).

They have F.layer_norm's signature, so each also works as
`normcheck compare --op layernorm --impl tests.mutants.layernorm:low_precision_param_sums`.
"""
from __future__ import annotations

from . import _fp8
from .textbook import layer_norm, named

BUGS = ("unbiased_normalise", "naive_variance", "low_precision_accumulation", "drop_xhat_term",
        "ignore_strides", "bf16_moments", "eps_outside_sqrt", "modifies_input", "dweight_missing_invstd",
        "low_precision_param_sums", "ignore_storage_offset",
        "constant_stats_double_backward", "overwrites_dy", "frozen_x_fast_path", "frozen_params_fast_path",
        "nondeterministic_sum",
        # on the paths kernels dispatch on: one set, a long set, channel lanes, G = 1 and G = C, eps, momentum
        "one_set_blocks", "long_set_halves", "hard_coded_eps",
        # on one size path of a tiled kernel, where only the boundary scans reach (rows and row lengths)
        "whole_tile_tail", "two_warp_sets", "persistent_row_tail", "one_row_param_block",
        # in its forward-mode formula alone (a custom Function's jvp): forward and backward stay right
        "jvp_missing_stat_terms", "jvp_ignores_weight_tangent",
        # on paths nobody named (tests/mutants/textbook.py's _dispatched): the data pointer's alignment, rows at a
        # pitch, a size table's 5·2^j and 7·2^j entries, and paths chosen by three conditions at once
        "vec8_path_last_vector", "row_stride_as_length", "table_5x_entry", "table_7x_entry", "mixed_tail_weight",
        "frozen_x_half_tail")
MUTANTS = {bug: named(layer_norm, bug) for bug in BUGS}
textbook = layer_norm()
FP8_MUTANTS, FP8_CORRECT = _fp8.records(textbook, "layernorm", {}, __name__)
MUTANTS |= FP8_MUTANTS
uncentred_jvp = named(layer_norm, "uncentred_jvp")  # (correct: the same formula written another way)
tiled_sums = named(layer_norm, "tiled_sums")  # (correct: statistics merged from tiles)
dispatched_paths = named(layer_norm, "dispatched_paths")  # (correct: a size table's entries merged from their chunks)
CORRECT = {"textbook": textbook, "uncentred_jvp": uncentred_jvp, "tiled_sums": tiled_sums,
           "dispatched_paths": dispatched_paths, **FP8_CORRECT}
globals().update(MUTANTS | FP8_CORRECT)
