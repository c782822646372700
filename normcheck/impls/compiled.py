"""torch.compile of torch's own functional implementation of every op (F's function; a fused op's eager composite),
forward and backward: the code users run once they compile a model (Inductor's CPU code generation; AOTAutograd
compiles the backward). Loaded by name where the implementation runs (compiling configures dynamo for that
process); the records live in impls.frameworks.

Compiled once per guard set and reused: shapes are dynamic (`dynamic=True`), so a new size reuses the code,
while a new dtype, rank, layout, set of parameters, requires-grad pattern or mode is a guard failure and a
compile of its own (seconds each on the CPU). A sweep has dozens of those per op, more than dynamo's default
recompile limit of 8, after which it would silently run the function eagerly — testing eager code under the
compiled name — so the limit is raised and hitting it fails the case instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo import config as dynamo_config
from torch._inductor import config as inductor_config

from ..ops import adaln, add_layernorm, add_rmsnorm, groupnorm_silu

dynamo_config.recompile_limit = 256
dynamo_config.accumulated_recompile_limit = 4096
dynamo_config.fail_on_recompile_limit_hit = True
inductor_config.compile_threads = 1  # (a pool of compile workers costs more than it saves on a few small graphs)


def _compiled(fn):
    return torch.compile(fn, dynamic=True)


batch_norm = _compiled(F.batch_norm)
group_norm = _compiled(F.group_norm)
layer_norm = _compiled(F.layer_norm)
rms_norm = _compiled(F.rms_norm)
instance_norm = _compiled(F.instance_norm)
# The fused ops have no F function: what a user compiles is their eager composite (each op record's torch Impl),
# add + RMSNorm's on F.rms_norm itself (the eager one's warning filter would be a graph break leaving the norm eager)
add_rms_norm = _compiled(add_rmsnorm.composite(F.rms_norm))
add_layer_norm = _compiled(add_layernorm.add_layer_norm)
group_norm_silu = _compiled(groupnorm_silu.group_norm_silu)
modulate = _compiled(adaln.modulate)
