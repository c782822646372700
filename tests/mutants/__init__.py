"""The mutant catalogue: plausible wrong implementations of every op, one module per op.

`tests/mutants/<op>.py` has MUTANTS (bug name -> function with the op's --impl contract, or an Impl
record when the implementation follows a convention such as RMSNorm's weight offset) and CORRECT
(correct implementations written in another style than torch's). The default sweep must fail every
mutant (tests/test_ops.py) and pass every correct one (tests/test_impls.py, beside the catalogue's own
implementations): that is what proves the tolerance model and the sweep see these bug classes. CATALOGUE finds the
module of every op in normcheck's OPS.
"""
import importlib

from normcheck import OPS, resolve_impl

CATALOGUE = {op: importlib.import_module(f"{__name__}.{op}") for op in OPS}


def bound(op: str, fn):
    """A function or Impl record, bound; distributed ones run in the lockstep world (threads: the sweep takes a
    second). Without hints: a mutant's failing row judged again under every other convention would make the
    templates several times slower (tests/test_hints.py tests them)."""
    return resolve_impl(op, fn, "lockstep" if OPS[op].distributed else None, hints=False)
