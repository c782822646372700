"""normcheck's CUDA kernels for the aten SyncBN primitives.

* ``syncbn_kernels.cu`` -- plain CUDA C++ with ``extern "C"`` launchers (raw pointers + stream);
* :mod:`.loader` -- builds it with nvcc into a cached shared library and loads it with ctypes
  (``python -m normcheck.kernels.syncbn.cuda.loader`` builds it now);
* :mod:`.primitives` -- the five primitives for torch CUDA tensors with aten's signatures, and
  ``register()`` / ``unregister()`` / ``using()`` to make them the CUDA kernels of the aten ops;
* :mod:`.backend` -- the ``lockstep-cuda`` and ``lockstep-cuda-normcheck`` SyncBN worlds.

Nothing here is imported by ``normcheck.kernels.syncbn``: importing it never builds anything.
Design and the GPU check: docs/cuda.md.
"""
