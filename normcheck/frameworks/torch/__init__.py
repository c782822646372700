"""The torch adapter: tensors in the case's dtypes and memory formats, autograd, interface checks."""
from .adapter import check_tensor, differentiate, grad_leaves, run, run_rank, to_numpy
from .tensors import (TORCH_DTYPES, TorchInputs, accumulation_dtype, describe_layout, device_missing, dtype_name, lay_out, to_device,
                      torch_inputs, with_threads)

__all__ = ["TORCH_DTYPES", "TorchInputs", "accumulation_dtype", "check_tensor", "describe_layout", "device_missing", "differentiate",
           "dtype_name", "grad_leaves", "lay_out", "run", "run_rank", "to_device", "to_numpy", "torch_inputs",
           "with_threads"]
