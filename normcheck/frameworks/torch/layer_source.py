"""What a layer's code says that its parameters' names do not, read from its source (ast; nothing runs): whether a
size argument takes one int or a shape, the parameters of the constructor its `**kwargs` reaches, the constants it
passes where an eps or a group count goes (or leaves to a default), and the dims and ranks its forward writes as
constants, in its own code or in the methods and module-level functions it calls (_with_helpers).

    ViTDet's LayerNorm(normalized_shape)      self.normalized_shape = (normalized_shape,)   one int, not a shape
    timm's LayerNorm(num_channels)            super().__init__(num_channels, ...)           nn.LayerNorm's shape
    timm's GroupNorm1(num_channels, **kw)     super().__init__(1, num_channels, **kw)       eps, affine reach it;
                                                                                            the group count is 1
    Flux's Normalize(in_channels)             nn.GroupNorm(num_groups=32, ..., eps=1e-6)    32 groups, eps 1e-6
    OLMo's LayerNorm.forward                  F.layer_norm(..., eps=1e-5)                   eps 1e-5
    Flux's RMSNorm.forward / DETR's           ... + 1e-6 / eps = 1e-5                       eps 1e-6 / 1e-5
    lucidrains' RMSNorm.forward               F.normalize(x, dim=-1) * self.scale * g       eps 1e-12 (its default)
    diffusers' RMSNorm.forward                x.pow(2).mean(-1, keepdim=True)               one normalised dim
    DETR's FrozenBatchNorm2d.forward          self.weight.reshape(1, -1, 1, 1)              4-D input only
    ViTDet's LayerNorm.forward                self.weight[:, None, None] * x                4-D input only
    timm's LayerNorm2d.forward                x.permute(0, 2, 3, 1)                         4-D input only
    timm's RmsNorm2d.forward                  rms_norm2d(x, ...): its mean(dim=1) and       one dim, 4-D input only
                                              weight.reshape(1, -1, 1, 1)                   (a function it calls)

Code whose source cannot be read (a builtin, a class made at run time) says nothing: None, or nothing found.
"""
from __future__ import annotations

import ast
import builtins
import collections.abc
import inspect
import textwrap
import types
import typing
from functools import lru_cache
from typing import Callable

SMALL = 1e-2  # a positive constant added below this is an eps (Flux's `mean(x²) + 1e-6`), not a shift of the data
DEPTH = 3     # how far an argument is followed into the constructors it is passed to
HELPERS = 2   # how many calls deep a forward's own methods and functions are read (forward -> fast path -> fallback)


@lru_cache(maxsize=256)
def _tree(fn: Callable) -> ast.FunctionDef | None:
    """The function's definition as ast, or None where its source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _owner(fn: Callable) -> type | None:
    """The class that defines the method `fn` (by its qualified name in its module)."""
    parts = getattr(fn, "__qualname__", "").split(".")
    obj = inspect.getmodule(fn)
    for part in parts[:-1]:
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None


def _resolve(fn: Callable, node: ast.expr):
    """The object a dotted name in `fn`'s body refers to (its module's globals, then builtins), or None."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    scope = {**vars(builtins), **getattr(fn, "__globals__", {})}
    obj = scope.get(node.id)
    for name in reversed(names):
        obj = getattr(obj, name, None)
    return obj


def _callee(fn: Callable, call: ast.Call) -> tuple[Callable, int] | None:
    """(the function a call in `fn` runs, how many of its leading parameters are not the call's arguments): a
    constructor for a class (`nn.GroupNorm(...)`, `super().__init__(...)`, `Base.__init__(self, ...)`), else the
    function itself."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "__init__":
        if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super":
            owner = _owner(fn)
            parent = next((c for c in (owner.__mro__[1:] if owner else ()) if "__init__" in vars(c)), None)
            return (parent.__init__, 1) if parent is not None and parent is not object else None
        base = _resolve(fn, func.value)
        return (base.__init__, 0) if isinstance(base, type) else None  # (self is the call's first argument)
    target = _resolve(fn, func)
    if isinstance(target, type):
        return (target.__init__, 1) if target.__init__ is not object.__init__ else None
    return (target, 0) if callable(target) else None


def _parameters(fn: Callable) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


@lru_cache(maxsize=256)
def _calls(fn: Callable) -> tuple:
    """Every argument of the calls `fn` makes, as _arguments finds them (read once per function)."""
    return tuple(_arguments(fn))


DEFAULT = object()  # (what _arguments yields for a parameter a call leaves to its default)


def _arguments(fn: Callable):
    """(callee parameter, the expression passed to it, the callee) for every argument of every call in `fn` whose
    callee resolves, (parameter, None, callee) for the callee's parameters that `fn`'s own `**kwargs` reaches, and
    (parameter, DEFAULT, callee) for those a call that passes no `*args` or `**kwargs` leaves to their default."""
    tree = _tree(fn)
    if tree is None:
        return
    kwargs = tree.args.kwarg.arg if tree.args.kwarg is not None else None
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        found = _callee(fn, call)
        params = _parameters(found[0]) if found else None
        if not params:
            continue
        params = params[found[1]:]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        bound, spread = set(), any(k.arg is None for k in call.keywords)
        for p, arg in zip(positional, call.args):
            if isinstance(arg, ast.Starred):
                spread = True
                break
            bound.add(p.name)
            yield p, arg, found[0]
        named = {p.name: p for p in params}
        for keyword in call.keywords:
            if keyword.arg in named:
                bound.add(keyword.arg)
                yield named[keyword.arg], keyword.value, found[0]
        if any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwargs for k in call.keywords):
            for p in params:
                if p.name not in bound and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    yield p, None, found[0]
        if not spread:
            for p in params:
                if p.name not in bound and p.default is not p.empty:
                    yield p, DEFAULT, found[0]


def reached(fn: Callable) -> list[tuple[inspect.Parameter, Callable]]:
    """(parameter, the function it is one of) for the parameters of the constructor (or function) to which `fn` passes
    its `**kwargs` on, less those the call binds itself: timm's GroupNorm1(num_channels, **kwargs) reaches
    nn.GroupNorm's eps, affine, device, dtype and bias."""
    params = _parameters(fn) or []
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        return []
    own = {p.name for p in params}
    found = [(p, callee) for p, arg, callee in _calls(fn) if arg is None and p.name not in own]
    return list({p.name: (p, callee) for p, callee in found}.values())


def constructed(fn: Callable) -> list[tuple[str, type]]:
    """(attribute, class) for each object of a class `fn` makes and keeps on self (`self.linear = nn.Linear(D, 2D)`):
    what a constructor holds, known before it runs."""
    tree = _tree(fn)
    found = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = _resolve(fn, node.value.func)
            names = [t.attr for t in node.targets if isinstance(t, ast.Attribute)
                     and isinstance(t.value, ast.Name) and t.value.id == "self"]
            if isinstance(made, type) and names:
                found.append((names[0], made))
    return found


def constants(fn: Callable, roles: dict[str, tuple[str, ...]], every: bool = False, defaults: bool = False):
    """role -> the number `fn` passes to a parameter of one of the role's names in the calls it makes (GroupNorm(32, C,
    eps=1e-6)), where it passes one value only; `every`: each (role, number) passed, as found; `defaults`: a number
    such a parameter holds by default where a call passes it none counts as passed (F.normalize(x, dim=-1): eps
    1e-12)."""
    found = []
    for p, arg, _ in _calls(fn):
        value = _number(arg) if arg is not DEFAULT else p.default if defaults and _is_number(p.default) else None
        role = next((r for r, named in roles.items() if p.name.lower() in named), None)
        if role is not None and value is not None:
            found.append((role, value))
    if every:
        return found
    values: dict[str, set] = {}
    for role, value in found:
        values.setdefault(role, set()).add(value)
    return {role: v.pop() for role, v in values.items() if len(v) == 1}


def written(method: Callable, roles: dict[str, tuple[str, ...]], added: str | None = None) -> dict[str, float]:
    """role -> the constant a forward (and the methods of its own it calls on self) writes for it, where it writes one
    value: passed to a parameter of the role's names (F.layer_norm(..., eps=1e-5), F.group_norm(x, 32, ...)) or left
    to such a parameter's default (F.normalize(x, dim=-1): its eps, 1e-12), assigned
    to such a name (eps = 1e-5), or, for the role `added`, a small positive constant added (mean(x²) + 1e-6)."""
    values: dict[str, set] = {}
    for fn in _with_helpers(method):
        for role, value in constants(fn, roles, every=True, defaults=True):
            values.setdefault(role, set()).add(value)
        tree = _tree(fn)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assign):
                role = next((r for t in node.targets if isinstance(t, ast.Name)
                             for r, named in roles.items() if t.id.lower() in named), None)
                value = _number(node.value)
            elif added is not None and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                role = added
                value = next((v for v in map(_number, (node.left, node.right)) if v is not None and 0 < v < SMALL),
                             None)
            else:
                continue
            if role is not None and value is not None:
                values.setdefault(role, set()).add(value)
    return {role: found.pop() for role, found in values.items() if len(found) == 1}


@lru_cache(maxsize=256)
def _with_helpers(method: Callable) -> list[Callable]:
    """`method` and the code of its own it runs, to HELPERS calls deep: the methods it calls on self (`self._norm(x)`),
    bound or not, and the functions it calls by name (timm's RmsNorm2d.forward: `rms_norm2d(x, ...)`, and through
    `fast_rms_norm2d` the same), so that what they write is the layer's. Each branch's helper is read (a fast path
    and its fallback): where they write different dims, ranks or constants, the readers read nothing."""
    fn = getattr(method, "__func__", method)
    owner = _owner(fn)
    found, level = [fn], [(fn, owner)]
    for _ in range(HELPERS):
        level = [(h, held) for f, by in level for h, held in _called(f, by) if h not in found]
        level = list({h: (h, held) for h, held in level}.values())  # (one helper called twice is read once)
        found += [h for h, _ in level]
    return found


@lru_cache(maxsize=256)
def _called(fn: Callable, owner: type | None) -> tuple[tuple[Callable, type | None], ...]:
    """(function, the class whose method it is) for each helper `fn` calls whose source normcheck reads: a method of
    `owner` called on self, or a module-level function called by a name of `fn`'s module (its globals; a name `fn`
    binds itself, a parameter or a local, is not that function). torch's own functions are not read: the readers know
    them by name (mean, F.layer_norm), and their code is generic in the dims it is given."""
    tree = _tree(fn)
    if tree is None:
        return ()
    bound = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)} | \
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        func = call.func
        if owner is not None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id == "self":
            helper = inspect.getattr_static(owner, func.attr, None)
            if isinstance(helper, types.FunctionType):
                found.append((helper, owner))
        elif isinstance(func, ast.Name) and func.id not in bound:
            helper = _resolve(fn, func)
            if isinstance(helper, types.FunctionType) and not _is_torchs(helper) and _tree(helper) is not None:
                found.append((helper, None))
    return tuple(found)


def _is_torchs(fn: Callable) -> bool:
    """Whether `fn` is torch's own (torch.nn.functional's layer_norm, torch's own helpers)."""
    return (getattr(fn, "__module__", None) or "").split(".")[0] == "torch"


# The calls that reduce over the dims they name (a tensor's method, or torch's function of the same name), and those
# that normalise over a shape they are given; the calls that regroup a tensor's dims, after which a reduction's axes
# no longer say which of the input's dims it covers
REDUCTIONS = ("mean", "sum", "var", "std", "var_mean", "std_mean", "norm", "vector_norm", "normalize")
METHOD_DIM_AT = {"norm": 1}  # (where a tensor's method takes its dims by position: x.norm(p, dim), else first)
SHAPED = ("normalized_shape",)
RESHAPES = ("reshape", "view")           # (to sizes it writes, a parameter's broadcast shape: no regrouping)
REGROUPS = ("flatten", "unflatten") + RESHAPES


@lru_cache(maxsize=256)
def reduced_dims(method: Callable) -> tuple[int, str] | None:
    """(how many dims, the code that says so) a forward (and the code of its own it calls: _with_helpers) reduces over
    where every reduction it makes names its dims as constants, and as many each: `h.pow(2).mean(-1, keepdim=True)`,
    F.normalize(x, dim=-1): (1, "mean(-1)"); F.layer_norm(x, (x.shape[-1],)): one dim, a 1-tuple; timm's RmsNorm2d:
    (1, "mean(1) in rms_norm2d"). None where one reduction names them otherwise (a variable, all dims: a helper given
    its dims, `mean(dim)`), a norm is given a shape (F.layer_norm(x, self.normalized_shape)), the forward regroups a
    tensor's dims by sizes it computes (x.flatten(-2) before mean(-1)), or it reduces nothing its source shows."""
    found, helpers = [], _with_helpers(method)
    for fn in helpers:
        tree = _tree(fn)
        if tree is None:
            return None
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else \
                call.func.id if isinstance(call.func, ast.Name) else None
            if name in REGROUPS and not (name in RESHAPES and _literal_shape(call)):
                return None
            if name in REDUCTIONS and not _is_read(_resolve(fn, call.func), helpers):
                dims = _reduction_dims(fn, call)
                if dims is None:
                    return None
                found.append((len(dims), f"{name}({dims[0] if len(dims) == 1 else dims}){_in(fn, helpers)}"))
        for p, arg, callee in _calls(fn):  # (a shape passed on to a helper is read where the helper uses it)
            if p.name in SHAPED and isinstance(arg, ast.AST) and not _is_read(callee, helpers):
                if not isinstance(arg, (ast.Tuple, ast.List)) or any(isinstance(e, ast.Starred) for e in arg.elts):
                    return None
                found.append((len(arg.elts), f"{p.name}={ast.unparse(arg)}{_in(fn, helpers)}"))
    counts = {n for n, _ in found}
    return found[0] if len(counts) == 1 else None


def _is_read(target, helpers: list[Callable]) -> bool:
    """Whether a call runs one of the helpers whose own code is read (a helper named `normalize` is not F.normalize)."""
    return isinstance(target, types.FunctionType) and any(target is h for h in helpers)


def _in(fn: Callable, helpers: list[Callable]) -> str:
    """Where code a reader quotes is written, where it is not the forward's own: " in rms_norm2d"."""
    return "" if fn is helpers[0] else f" in {fn.__name__}"


def _reduction_dims(fn: Callable, call: ast.Call) -> tuple[int, ...] | None:
    """The dims a reduction names as constants (None: it names them otherwise, or none: all of them). A tensor's
    method takes them first (h.mean(-1)); a function of torch's after its input (torch.mean(h, -1)), or by the
    parameter its signature names dim, whose default holds where the call passes none (F.normalize's dim=1)."""
    keyword = next((k.value for k in call.keywords if k.arg in ("dim", "axis")), None)
    if keyword is not None:
        return _dims(keyword)
    target = _resolve(fn, call.func)
    if target is None:  # (a method of a tensor the forward holds)
        at = METHOD_DIM_AT.get(call.func.attr if isinstance(call.func, ast.Attribute) else None, 0)
        return _dims(call.args[at]) if at < len(call.args) else None
    params = [p for p in _parameters(target) or () if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    at = next((i for i, p in enumerate(params) if p.name in ("dim", "axis")), None if params else 1)
    if at is not None and at < len(call.args):
        return _dims(call.args[at])
    default = params[at].default if at is not None and at < len(params) else None
    return (default,) if isinstance(default, int) and not isinstance(default, bool) else None


def _dims(node: ast.expr) -> tuple[int, ...] | None:
    """Constant dims: one (-1) or a tuple or list of them ((-2, -1))."""
    elements = node.elts if isinstance(node, (ast.Tuple, ast.List)) else [node]
    dims = [_number(e) for e in elements]
    return tuple(dims) if elements and all(isinstance(d, int) for d in dims) else None


def _literal_shape(call: ast.Call) -> tuple[int, ...] | None:
    """The sizes a reshape or view writes as constants (w.reshape(1, -1, 1, 1), w.view((1, -1))), else None."""
    args = call.args[0].elts if len(call.args) == 1 and isinstance(call.args[0], (ast.Tuple, ast.List)) else call.args
    sizes = [_number(a) for a in args]
    return tuple(sizes) if args and not call.keywords and all(isinstance(s, int) for s in sizes) else None


@lru_cache(maxsize=256)
def written_ranks(method: Callable, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], str] | None:
    """(the input ranks of `ranks` it takes, the code that says so) where a forward (and the code of its own it calls:
    _with_helpers) broadcasts a tensor against its input by a shape it writes as constants, the batch dim's 1 first:
    w.reshape(1, -1, 1, 1) meets the input's dim 1 only where the input is 4-D (another rank puts w on another dim,
    or makes y of another rank); w.view(1, 1, -1) meets the last dim of an input of 3 dims or more; w[:, None, None]
    meets dim 1 of 4-D input; and where it permutes a tensor's dims in an order it writes, x.permute(0, 2, 3, 1) takes
    4-D input. timm's RmsNorm2d writes both in its helpers (a fast path's permute, the fallback's reshape): 4-D. None:
    it writes no such shape, it asks its input's rank (x.dim(), x.ndim: it adapts to it), or two of the functions it
    runs take other ranks (a fast path and a fallback that disagree: which one runs is not in the source)."""
    readings, helpers = [], _with_helpers(method)
    for fn in helpers:
        read = _ranks_written(fn, ranks)
        if read is ADAPTS:
            return None
        if read is not None:
            readings.append((read[0], read[1] + _in(fn, helpers)))
    return readings[0] if len({taken for taken, _ in readings}) == 1 else None


ADAPTS = ((), "")  # (what _ranks_written reads of code that asks its input's rank)


@lru_cache(maxsize=256)
def _ranks_written(fn: Callable, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], str] | None:
    """What one function's code says of its input's rank (written_ranks): (the ranks of `ranks` its broadcast shapes
    and permutations take, the first of them as written), ADAPTS where it asks a tensor's rank, None where it writes
    none."""
    found, said, tree = set(), None, _tree(fn)
    for node in ast.walk(tree) if tree is not None else ():
        if _asks_rank(node):
            return ADAPTS
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "permute":
            order = _literal_shape(node)  # (x.permute(0, 2, 3, 1): its input has as many dims as it names)
            if order is not None and sorted(order) == list(range(len(order))):
                found |= {r for r in ranks if r == len(order)}
                said = said or f"permute{order}"
            continue
        if isinstance(node, ast.Subscript):
            shape = _indexed_shape(node)
            how = None if shape is None else f"[{', '.join(':' if n == -1 else 'None' for n in shape)}]"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RESHAPES:
            shape, how = _literal_shape(node), None
        else:
            continue
        if shape is None or len(shape) < 2 or shape.count(-1) != 1 or set(shape) - {1, -1}:
            continue
        if shape[0] == 1:  # (the batch dim's 1 first: the whole input's shape)
            found |= {r for r in ranks if r == len(shape) or (shape[-1] == -1 and r > len(shape))}
        elif shape[0] == -1:  # (the channels first, the batch dim left to broadcasting: w[:, None, None])
            found |= {r for r in ranks if r == len(shape) + 1}
        else:
            continue
        said = said or how or f"{node.func.attr}{shape}"
    return (tuple(sorted(found)), said) if said is not None else None


def _indexed_shape(node: ast.Subscript) -> tuple[int, ...] | None:
    """The shape an index of one full slice and new axes gives a 1-D tensor (w[:, None, None]: (-1, 1, 1)), else None."""
    elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    whole = [isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None for e in elements]
    new = [isinstance(e, ast.Constant) and e.value is None for e in elements]
    if whole.count(True) != 1 or not all(a or b for a, b in zip(whole, new)):
        return None
    return tuple(-1 if w else 1 for w in whole)


def _asks_rank(node: ast.AST) -> bool:
    """x.dim(), x.ndimension(), x.ndim, len(x.shape): code that reads a tensor's rank."""
    if isinstance(node, ast.Attribute) and node.attr == "ndim":
        return True
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("dim", "ndimension") and not node.args:
        return True
    return isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1 and \
        isinstance(node.args[0], ast.Attribute) and node.args[0].attr in ("shape", "size")


def takes_shape(fn: Callable, name: str, default: Callable[[str], bool]) -> bool:
    """Whether `fn`'s size argument `name` takes a shape (a tuple of sizes) rather than one int: its annotation says
    so; else its source (isinstance(name, ...), tuple(name), len(name), *name: a shape; (name,) or [name]: one int
    made a shape); else a constructor it is passed to says so of its own argument; else `default(name)`."""
    said = _says(fn, name, DEPTH)
    return default(name) if said is None else said


def _says(fn: Callable, name: str, depth: int) -> bool | None:
    params = {p.name: p for p in _parameters(fn) or ()}
    if name in params:
        said = _annotated(params[name].annotation, fn)
        if said is not None:
            return said
    tree = _tree(fn)
    if tree is None:
        return None
    said = _used(tree, name)
    if said is not None or depth == 0:
        return said
    passed = (_says(callee, p.name, depth - 1) for p, arg, callee in _calls(fn)
              if isinstance(arg, ast.Name) and arg.id == name)
    return next((s for s in passed if s is not None), None)


def _annotated(annotation, fn: Callable) -> bool | None:
    """What a size argument's annotation says: a shape (any sequence among its types), one int, or nothing."""
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):  # (postponed: evaluated as typing.get_type_hints would, else read as text)
        try:
            annotation = typing.get_type_hints(fn).get(next(
                p for p, a in getattr(fn, "__annotations__", {}).items() if a == annotation))
        except Exception:  # noqa: BLE001 - a name only a type checker sees: the text says what it can
            text = annotation.replace(" ", "")
            return True if any(s in text for s in ("tuple", "Tuple", "list", "List", "Sequence", "Size")) else \
                False if text in ("int", "Optional[int]", "int|None") else None
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    kinds = [typing.get_origin(m) or m for m in members]
    if any(isinstance(k, type) and issubclass(k, collections.abc.Sequence) and not issubclass(k, str) for k in kinds):
        return True
    return False if int in kinds else None


def _used(tree: ast.FunctionDef, name: str) -> bool | None:
    """How a constructor's code uses a size argument: as a shape (isinstance, tuple, list, len of it, *it) or as one
    int it makes a shape of ((name,), [name]); None: neither."""
    def is_name(node):
        return isinstance(node, ast.Name) and node.id == name

    single = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("isinstance", "tuple", "list", "len") and node.args and is_name(node.args[0]):
            return True
        if isinstance(node, ast.Starred) and is_name(node.value):
            return True
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == 1 and is_name(node.elts[0]):
            single = True
    return False if single else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(node: ast.expr | None) -> float | None:
    """A numeric constant's value (a negated one too), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _number(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    return None
