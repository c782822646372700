"""The mutant catalogue: plausible wrong implementations of every op, one module per op.

Each module has MUTANTS (bug name -> function with the op's --impl contract) and CORRECT (correct
implementations written in another style than torch's). The default sweep must fail every mutant
and pass every correct one (tests/test_ops.py): that is what proves the tolerance model and the
sweep see these bug classes. A new op adds its module here.
"""
from . import batchnorm, groupnorm, syncbn, syncbn_silu

CATALOGUE = {"batchnorm": batchnorm, "groupnorm": groupnorm, "syncbn": syncbn, "syncbn_silu": syncbn_silu}
