"""SyncBatchNorm kernels normcheck owns.

Importing this package registers CPU kernels for the aten SyncBN primitives
(``batch_norm_stats``, ``batch_norm_gather_stats(_with_counts)``, ``batch_norm_elemt``,
``batch_norm_backward_reduce``, ``batch_norm_backward_elemt``) with ``torch.library``, so torch's
own ``torch.nn.modules._functions.SyncBatchNorm`` runs on CPU (e.g. under gloo).  Registration is
done once per process, skips ops that already have a CPU kernel, and is idempotent; see
:mod:`normcheck.kernels.syncbn.cpu_primitives`.
"""

from . import cpu_primitives

__all__ = ["cpu_primitives"]
