"""Framework adapters: the only code that turns a case's NumPy inputs into a framework's tensors.

An adapter module provides
  run(op, bound, case, inputs)       -> (outputs, path, ops)   one process: forward + backward of bound.impl.target
and, for the worlds it runs ranks in, one of
  run_rank(op, fn, case, inputs, rank, group, size, device=None) -> outputs   one rank of a world (torch)
  run_devices(op, bound, case, inputs) -> [outputs per device] every device of a world simulated in this process
                                     (with KERNELS: the `ops` of such a run, which known issues follow)
where outputs are float64 NumPy arrays named like the op's reference outputs (path: the code path the
implementation says it took; ops: the framework kernels it ran, which known issues follow), after the interface
checks (shapes, dtypes, detached outputs, inputs and grad_output left unmodified). Anything the
implementation does wrong there raises ImplError.

`FRAMEWORKS` maps an Impl record's `framework` to its adapter, imported when first used: importing normcheck
imports no JAX or TensorFlow, and a framework that is not installed is a one-line error naming the extra.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec

from ..core.errors import UsageError

# name -> (adapter module, what it is called, the packages its extra installs, the extra, which of an op's
# contracts its functions follow: Op.contract)
_ADAPTERS = {
    "torch": ("torch", "torch", (), None, "torch"),
    "numpy": ("numpy", "NumPy", (), None, "direct"),  # (its functions return every output themselves)
    "jax": ("jax", "JAX", ("jax", "flax"), "jax", "array"),
    "tf": ("tensorflow", "TensorFlow", ("tensorflow", "keras"), "tf", "array"),
}


class Frameworks:
    """The adapters by framework name (`FRAMEWORKS["jax"]`), each imported on first use."""

    def title(self, name: str) -> str:
        return _ADAPTERS[name][1]

    def contract(self, name: str) -> str:
        """Which of an op's contracts the framework's functions follow (Op.contract): "torch" or "array"."""
        return _ADAPTERS[name][4]

    def missing(self, name: str) -> str | None:
        """Why `name`'s implementations cannot run here (an unknown framework, packages not installed); None: they can."""
        if name not in _ADAPTERS:
            return f"unknown framework {name!r}; choose one of {', '.join(_ADAPTERS)}"
        _, title, packages, extra, _ = _ADAPTERS[name]
        absent = [p for p in packages if find_spec(p) is None]
        if absent:
            return (f"the {title} implementations need {' and '.join(absent)}: pip install -e \".[{extra}]\" "
                    f"(or pip install \"normcheck[{extra}]\")")
        return None

    def versions(self, name: str) -> dict[str, str]:
        """The installed version of each package `name`'s extra brings ("none" when absent)."""
        return {package: _version(package) for package in _ADAPTERS[name][2]}

    def __getitem__(self, name: str):
        why = self.missing(name)
        if why:
            raise UsageError(why)
        return importlib.import_module(f"{__name__}.{_ADAPTERS[name][0]}")


FRAMEWORKS = Frameworks()


def _version(package: str) -> str:
    for distribution in (package, f"{package}-cpu"):  # (TensorFlow's CPU wheel has a name of its own)
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "none"


def run_case(bound, case, inputs):
    """Run a bound implementation's case (ops.Bound) under its framework's adapter in this process: (outputs, path,
    ops); for a world of devices simulated here (a distributed op) the outputs are one dict per device."""
    adapter = FRAMEWORKS[bound.framework]
    if case.record.distributed:
        per_device = adapter.run_devices(case.record, bound, case, inputs)
        return per_device, bound.impl.reported_path(case), adapter.KERNELS
    outputs, path, ops = adapter.run(case.record, bound, case, inputs)
    return inputs.kept(outputs), path, ops
