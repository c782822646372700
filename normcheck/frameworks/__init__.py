"""Framework adapters: the only code that turns a case's NumPy inputs into a framework's tensors.

An adapter module provides
  run(op, impl, case, inputs)        -> (outputs, path, ops)   one process: forward + backward of impl.target
  run_rank(op, fn, case, inputs, rank, group, size, device=None) -> outputs   one rank of a world
where outputs are float64 NumPy arrays named like the op's reference outputs (path: the code path the
implementation says it took; ops: the framework kernels it ran, which known issues follow), after the interface
checks (shapes, dtypes, detached outputs, inputs and grad_output left unmodified). Anything the
implementation does wrong there raises ImplError. `FRAMEWORKS` maps an Impl record's `framework`
to its adapter.
"""
from . import numpy as numpy_adapter
from . import torch as torch_adapter

FRAMEWORKS = {"torch": torch_adapter, "numpy": numpy_adapter}
