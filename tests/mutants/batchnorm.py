"""BatchNorm mutants: the textbook implementation with one bug each.

They have F.batch_norm's signature, so each also works as
`normcheck compare --op batchnorm --impl tests.mutants.batchnorm:naive_variance`.
"""
from __future__ import annotations

from .textbook import batch_norm, named

BUGS = ("unbiased_normalise", "naive_variance", "low_precision_accumulation", "drop_xhat_term",
        "biased_running_var", "ignore_strides", "bf16_moments", "eps_outside_sqrt", "momentum_swapped",
        "modifies_input", "per_sample_variance", "dweight_missing_invstd",
        "eval_uses_batch_stats", "eval_updates_running_stats", "constant_stats_double_backward", "overwrites_dy", "frozen_x_fast_path", "frozen_params_fast_path",
        "nondeterministic_sum",
        # on the paths kernels dispatch on: one set, a long set, channel lanes, G = 1 and G = C, eps, momentum
        "channels_last_lane_sums", "eval_hard_coded_eps", "fixed_momentum", "long_set_halves", "one_set_blocks",
        # a size-1 dim's stride read as if it meant something: a channels-last path that reads x's raw strides
        "raw_stride_layout",
        # on one size path of a tiled kernel, where only the boundary scans reach (channels)
        "vec4_channel_tail",
        # on paths chosen by three conditions at once (a dtype or mode, channels-last, a channel tail)
        "half_channels_last_tail", "eval_channels_last_tail")
MUTANTS = {bug: named(batch_norm, bug) for bug in BUGS}
textbook = batch_norm()
CORRECT = {"textbook": textbook}
globals().update(MUTANTS)
