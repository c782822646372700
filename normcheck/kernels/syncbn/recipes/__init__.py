"""SyncBN recipes: our own autograd Functions in the styles SyncBN has been written in over the years.

Each has the syncbn contract `fn(input, weight, bias, running_mean, running_var, eps, momentum,
process_group, world_size)`. They call the aten SyncBN primitives (normcheck registers CPU kernels
for them) and normcheck.kernels.syncbn.collectives, so they run in the lockstep and gloo worlds.
"""
