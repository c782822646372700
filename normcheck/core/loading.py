"""Load the code under test from a `module:attr` or `path/to/file.py:attr` spec, and check its arity.

A leaf: front ends resolve `--impl` with it, and every world's ranks load their implementation
with it (a gloo worker receives only the spec).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import UsageError
from .text import first_line


def load_callable(spec: str) -> Callable:
    """Import `module:attr` (the current directory is importable) or `file.py:attr`: a function."""
    obj = load_object(spec)
    if not callable(obj):
        raise UsageError(f"--impl {spec}: {spec.rpartition(':')[2]} is a {type(obj).__name__}, not callable")
    return obj


def load_object(spec: str):
    """What `module:attr` or `file.py:attr` names (a function, or a record describing one)."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise UsageError(f"--impl {spec!r} must look like module:attr or path/to/file.py:attr")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"--impl {spec}: no file {module_name}")
            # Registered under a name of its own before it runs: a dataclass (or anything else that looks its module
            # up in sys.modules while the module is executing) needs it there, and no real module may be shadowed
            name = f"_normcheck_file_{path.stem}_{zlib.crc32(str(path.resolve()).encode()):08x}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = sys.modules[name] = importlib.util.module_from_spec(mod_spec)
            try:
                mod_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the user's project is importable
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except SystemExit as e:  # (a script without a main guard that ends itself: not normcheck's exit)
        raise UsageError(f"--impl {spec}: cannot import {module_name}: its import called sys.exit({e.code!r})") from None
    except Exception as e:  # ImportError, SyntaxError, or anything the module raises at import
        raise UsageError(f"--impl {spec}: cannot import {module_name}: {type(e).__name__}: {first_line(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--impl {spec}: {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Arguments:
    """What a contract's signature text says its calls pass: `fn(input, weight, *, axes, eps[, group_size])`."""
    positional: tuple[str, ...]  # by position, in order
    keywords: tuple[str, ...]    # by name, after a bare `*` (an array contract's)
    optional: tuple[str, ...]    # `[, name]`: by name, in the cases that have it (group_size=G where a case has groups)


def contract_arguments(signature: str) -> Arguments:
    """The arguments of a contract's first form, `fn(...)` up to its closing parenthesis (later forms and the text
    after `->` are prose). The one reader of that text: an optional `[, name]` is neither a positional argument nor
    part of the name before it."""
    inside = signature.split("(", 1)[1].split(")", 1)[0]
    optional = [n.strip() for group in re.findall(r"\[\s*,([^\]]*)\]", inside) for n in group.split(",")]
    listed = [n.strip() for n in re.sub(r"\[[^\]]*\]", "", inside).split(",") if n.strip()]
    cut = listed.index("*") if "*" in listed else len(listed)
    return Arguments(tuple(listed[:cut]), tuple(listed[cut + 1:]), tuple(n for n in optional if n))


def check_arity(name: str, fn: Callable, signature: str) -> None:
    """UsageError when `fn` cannot be called as `signature` says (misfit)."""
    why = misfit(name, fn, signature)
    if why:
        raise UsageError(why)


def misfit(name: str, fn: Callable, signature: str) -> str | None:
    """Why `fn` cannot be called as `signature` says (None: it can): its positional arguments, and the keywords
    named after a bare `*` (an array contract's). An optional argument is the case's to pass and the function's to
    decline (ops.grouped_rmsnorm.group_keywords), never an arity error."""
    arguments = contract_arguments(signature)
    wanted, keywords = len(arguments.positional), arguments.keywords
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None  # builtins without a signature: trust them, failures become failing rows
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > wanted or len(positional) < wanted:
        return f"{name} takes {len(positional)} positional arguments; the contract is {signature}"
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [k for k in keywords if k not in named]
    if missing and not any(p.kind == p.VAR_KEYWORD for p in params):
        return f"{name} takes no keyword {missing[0]}; the contract is {signature}"
    # (a later form of the contract in the same text, `fn(..., name=value)`, passes those keywords in the cases a case
    # field selects: LayerNorm's and RMSNorm's `with --fp8: fn(..., eps, scale=scale, fp8_dtype=dtype)`)
    variants = {k for form in re.findall(r"\bfn\(([^)]*)\)", signature)[1:] for k in re.findall(r"(\w+)=", form)}
    unknown = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty
               and p.name not in keywords and p.name not in variants]
    if unknown:
        return f"{name} requires a keyword {unknown[0]} the contract does not pass; the contract is {signature}"
    return None


def spec_of(fn: Callable) -> str:
    """The `module:attr` a function is importable under (how a function travels to other processes)."""
    return f"{fn.__module__}:{fn.__qualname__}"


def absolute_spec(spec: str) -> str:
    """`path/to/file.py:attr` with the path made absolute (workers may stand in another directory)."""
    module, _, attr = spec.rpartition(":")
    if module.endswith(".py") and Path(module).is_file():
        return f"{Path(module).resolve()}:{attr}"
    return spec


@dataclass(frozen=True)
class Code:
    """What `--impl` names, read once (load_code): the object, the name its rows show, the spec another process loads
    it by (None: given as an object and not importable by name), why it cannot be called as the contract says (None:
    it can), the parameters a keyword can pass, and what the contract's calls pass (its `arguments`)."""
    obj: object
    name: str
    spec: str | None
    misfit: str | None
    keywords: frozenset[str]
    arguments: Arguments


def load_code(target: str | Callable, signature: str, by_name: bool = False) -> Code:
    """`target` (a `module:attr` / `file.py:attr` spec, or the object itself) loaded and read against the contract's
    `signature`. `by_name`: an object given directly is named by the spec it is importable under (how a function
    reaches another process's ranks); else by its qualified name."""
    if isinstance(target, str):
        obj, name, spec = load_object(target), target, absolute_spec(target)
    else:
        obj, spec = target, spec_of(target) if by_name else None
        name = spec or getattr(target, "__qualname__", repr(target))
    try:
        params = inspect.signature(obj).parameters.values() if callable(obj) else ()
    except (TypeError, ValueError):
        params = ()
    keywords = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return Code(obj, name, spec, misfit(name, obj, signature) if callable(obj) else None, keywords,
                contract_arguments(signature))
