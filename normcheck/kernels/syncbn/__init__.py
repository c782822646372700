"""SyncBatchNorm kernels normcheck owns: CPU kernels for the aten SyncBN primitives
(``cpu_primitives.register()`` installs them, see :mod:`normcheck.kernels.syncbn.cpu_primitives`),
CUDA kernels for them (``cuda/``), the collectives recipes call, and the recipes themselves.
Importing this package registers nothing.
"""
