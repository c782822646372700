"""The mutant catalogue: plausible wrong implementations of every op, one module per op.

`tests/mutants/<op>.py` has MUTANTS (bug name -> function with the op's --impl contract, or an Impl
record when the implementation follows a convention such as RMSNorm's weight offset) and CORRECT
(correct implementations written in another style than torch's). The default sweep must fail every
mutant and pass every correct one (tests/test_ops.py): that is what proves the tolerance model and
the sweep see these bug classes. CATALOGUE finds the module of every op in normcheck's OPS.
"""
import importlib

from normcheck import OPS

CATALOGUE = {op: importlib.import_module(f"{__name__}.{op}") for op in OPS}
