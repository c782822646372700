"""Implementations under test: the built-in ones, and user ones given as `module:attr`."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch.nn.functional as F

from .baseline import run_baseline
from .cases import DISTRIBUTED_OPS, Case
from .errors import UsageError
from .known_issues import (BN_CHANNELS_LAST_F32_CANCELLATION, BN_F16_INTERMEDIATES, BN_MIXED_SLOW_PATH,
                           GN_CHANNELS_LAST_VARIANCE, GN_F16_OVERFLOW, GN_MIXED_MOMENTS, GN_NATIVE_DY_LAYOUT,
                           KnownIssue)
from . import syncbn
from .ops import get_op
from .runners import Runner, functional_batchnorm, functional_groupnorm, native_batchnorm_backward, native_groupnorm_backward


def supports_everything(case: Case) -> str | None:
    return None


@dataclass(frozen=True)
class Impl:
    name: str
    op: str
    description: str
    run: Runner
    supports: Callable[[Case], "str | None"] = supports_everything  # None, or why a case is skipped
    capabilities: str = "all dtypes (f64, f32, f16, bf16, mixed), all memory formats, 2-D to 5-D"
    known_issues: tuple[KnownIssue, ...] = ()

    def known_issue(self, case: Case) -> KnownIssue | None:
        return next((k for k in self.known_issues if k.applies(case)), None)


IMPLS: dict[str, dict[str, Impl]] = {}


def register(impl: Impl) -> Impl:
    IMPLS.setdefault(impl.op, {})[impl.name] = impl
    return impl


def _native_group_norm_layouts(case: Case) -> str | None:
    if case.x_format == "strided":
        return "aten.native_group_norm requires x contiguous in a standard memory format (it raises otherwise)"
    return None


_TORCH_BN_ISSUES = (BN_MIXED_SLOW_PATH, BN_F16_INTERMEDIATES, BN_CHANNELS_LAST_F32_CANCELLATION)
_TORCH_GN_ISSUES = (GN_CHANNELS_LAST_VARIANCE, GN_MIXED_MOMENTS, GN_F16_OVERFLOW)

for _impl in (
    Impl("torch", "batchnorm", "torch.nn.functional.batch_norm through autograd", functional_batchnorm(F.batch_norm),
         known_issues=_TORCH_BN_ISSUES),
    Impl("torch-native-backward", "batchnorm",
         "aten.native_batch_norm + aten.native_batch_norm_backward called directly", native_batchnorm_backward,
         known_issues=_TORCH_BN_ISSUES),
    Impl("baseline", "batchnorm", "normcheck's same-precision baseline (float32 accumulation)", run_baseline),
    Impl("torch", "groupnorm", "torch.nn.functional.group_norm through autograd", functional_groupnorm(F.group_norm),
         known_issues=_TORCH_GN_ISSUES),
    Impl("torch-native-backward", "groupnorm",
         "aten.native_group_norm + aten.native_group_norm_backward called directly", native_groupnorm_backward,
         supports=_native_group_norm_layouts,
         capabilities="all dtypes; x in contiguous/channels_last/channels_last_3d (not strided), 2-D to 5-D",
         known_issues=_TORCH_GN_ISSUES + (GN_NATIVE_DY_LAYOUT,)),
    Impl("baseline", "groupnorm", "normcheck's same-precision baseline (float32 accumulation)", run_baseline),
):
    register(_impl)

DEFAULT_IMPL = "torch"
DEFAULT_IMPLS = {"syncbn_silu": "fused-silu"}  # torch ships no fused BN + SiLU


def _syncbn_impl(op: str, spec: str, backend: str | None, timeout: float) -> Impl:
    """SyncBN implementations run in a world: a recipe by name, or user code given as module:attr."""
    recipe = syncbn.RECIPES.get(spec)
    if recipe is not None and recipe.op == op:
        backend = backend or recipe.default_backend
        return Impl(recipe.name, op, recipe.description, syncbn.world_runner(recipe.spec, backend, timeout),
                    supports=syncbn.supports(recipe, backend),
                    capabilities=f"{', '.join(recipe.backends)} worlds; all dtypes and memory formats",
                    known_issues=recipe.known_issues)
    if ":" not in spec:
        known = ", ".join(name for name, r in syncbn.RECIPES.items() if r.op == op)
        raise UsageError(f"unknown implementation {spec!r} for {op}; use one of {known} or module:attr")
    _check_arity(spec, load_callable(spec), get_op(op).signature)  # fail early, in this process
    return Impl(spec, op, f"user implementation {spec}",
                syncbn.world_runner(spec, backend or "gloo", timeout), capabilities="unknown (user code)")


for _recipe in syncbn.RECIPES.values():
    register(_syncbn_impl(_recipe.op, _recipe.name, None, syncbn.DEFAULT_TIMEOUT))


def list_impls(op: str) -> list[Impl]:
    get_op(op)
    return list(IMPLS.get(op, {}).values())


def resolve_impl(op: str, spec: str | Impl | Callable | None = None, backend: str | None = None,
                 timeout: float = syncbn.DEFAULT_TIMEOUT) -> Impl:
    """A registered name, a `module:attr` / `path/to/file.py:attr` spec, an Impl or a callable.

    `backend` and `timeout` choose the world of a syncbn implementation.
    """
    the_op = get_op(op)
    if spec is None:
        spec = DEFAULT_IMPLS.get(op, DEFAULT_IMPL)
    if isinstance(spec, Impl):
        return spec
    if op in DISTRIBUTED_OPS:
        if callable(spec):  # a function is sent to gloo workers by name: it must be importable
            spec = f"{spec.__module__}:{spec.__qualname__}"
        return _syncbn_impl(op, spec, backend, timeout)
    if callable(spec):
        return _user_impl(op, getattr(spec, "__qualname__", repr(spec)), spec)
    if spec in IMPLS.get(op, {}):
        return IMPLS[op][spec]
    if ":" not in spec:
        known = ", ".join(IMPLS.get(op, {}))
        raise UsageError(f"unknown implementation {spec!r} for {op}; use one of {known} or module:attr")
    fn = load_callable(spec)
    return _user_impl(op, spec, fn, the_op.signature)


def _user_impl(op: str, name: str, fn: Callable, signature: str = "") -> Impl:
    _check_arity(name, fn, signature or get_op(op).signature)
    return Impl(name, op, f"user implementation {name}", get_op(op).adapt(fn), capabilities="unknown (user code)")


def _check_arity(name: str, fn: Callable, signature: str) -> None:
    wanted = signature.split("(", 1)[1].split(")", 1)[0].count(",") + 1
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them, failures become failing rows
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > wanted or len(positional) < wanted:
        raise UsageError(f"{name} takes {len(positional)} positional arguments; the contract is {signature}")


def load_callable(spec: str) -> Callable:
    """Import `module:attr` (the current directory is importable) or `file.py:attr`."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise UsageError(f"--impl {spec!r} must look like module:attr or path/to/file.py:attr")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"--impl {spec}: no file {module_name}")
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the user's project is importable
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as e:  # ImportError, SyntaxError, or anything the module raises at import
        raise UsageError(f"--impl {spec}: cannot import {module_name}: {type(e).__name__}: {_first_line(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--impl {spec}: {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"--impl {spec}: {attr} is a {type(obj).__name__}, not callable")
    return obj


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


# normcheck's own channels-last GroupNorm kernel (built on first use) and torch's, at 1/2/3 threads.
from .kernels.groupnorm.impls import IMPLS as _GROUPNORM_KERNEL_IMPLS  # noqa: E402  (needs Impl above)

for _impl in _GROUPNORM_KERNEL_IMPLS:
    register(_impl)
