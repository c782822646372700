"""A layer given by its class: an `nn.Module` subclass (or a factory returning a configured module) judged as a
function under its op's contract, with no adapter code of the user's.

`Layer` is that function. Each call builds the module from the case (its constructor's arguments filled by their
names: the sizes, groups, eps, momentum and the switches for the parameters and running statistics), binds the
case's weight, bias and running statistics to the module's parameters and buffers by role, calls `forward` and
writes a reassigned running statistic back into the case's tensor (the contract updates them in place). A case the
constructor cannot express (no bias, a fixed eps, no running statistics, one size for several normalised dims) is
declined with `Unsupported`, which the engine reports as a SKIP row saying which argument is missing; so is a case
its code fixes otherwise (an eps or a group count written as a constant or left to a default, a size argument that
takes one int, a forward that reduces over one literal dim or is written for 4-D input only:
`layer_source` reads them). Nothing here knows an op: the contract's parameter names (from its signature) say what
each argument of a call is, and the op's record the constructor switches that choose it (`Op.layer_switches`).
"""
from __future__ import annotations

import inspect
from math import prod
from functools import partial
from typing import Any, Callable

import torch

from ...core.errors import UsageError, Unsupported
from ...core.loading import load_callable
from . import layer_source

# What a constructor's (or a factory's) parameter means, by the names the popular model libraries give it
SIZE_NAMES = ("normalized_shape", "hidden_size", "dim", "d_model", "n_embd", "embed_dim", "emb_dim", "embedding_dim",
              "model_dim", "hidden_dim", "features", "num_features", "num_channels", "channels", "in_channels",
              "n_channels", "hidden_channels", "normalized_dim", "size", "ndim", "d", "c", "n", "width", "n_state")
# Sizes that take a tuple where the layer's code says nothing either way (the others one int: one normalised dim);
# an annotation or the code itself says otherwise (layer_source.takes_shape)
SHAPE_NAMES = ("normalized_shape",)
GROUP_NAMES = ("num_groups", "groups", "n_groups", "num_group", "group_num", "g")
EPS_NAMES = ("eps", "epsilon", "variance_epsilon", "norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps")
MOMENTUM_NAMES = ("momentum",)
AFFINE_NAMES = ("elementwise_affine", "element_affine", "affine", "use_affine", "learnable", "learnable_weight", "with_scale",
                "use_scale")  # a switch for the weight (and the bias, where no switch of its own follows)
BIAS_NAMES = ("bias", "use_bias", "with_bias", "add_bias", "elementwise_bias", "center")
RUNNING_NAMES = ("track_running_stats",)
IGNORED_NAMES = ("device", "dtype")  # (the module's tensors are replaced by the case's)
# The module's tensors by role: the names layers give their parameters and buffers
TENSOR_NAMES = {
    "weight": ("weight", "gamma", "scale", "g", "w", "a_2"),  # (a_2, b_2: the annotated transformer's LayerNorm)
    "bias": ("bias", "beta", "shift", "b", "offset", "b_2"),
    "running_mean": ("running_mean", "moving_mean"),
    "running_var": ("running_var", "moving_var"),
}
# The contract's data arguments a forward takes after the input, by the names forwards give them
FORWARD_NAMES = {"residual": ("residual", "res", "residual_in", "skip"), "scale": ("scale",), "shift": ("shift",),
                 "gate": ("gate", "z")}  # (z: Mamba2's RMSNormGated)
# The values a case sets that a layer may fix in its code instead (an attribute, a constant it passes): role, the
# names that hold it, the case field a SKIP says it takes
FIXABLE = (("eps", EPS_NAMES, "eps"), ("momentum", MOMENTUM_NAMES, "momentum"), ("num_groups", GROUP_NAMES, "groups"))
# Modules that map an input to features rather than normalise it: their tensors are no norm's, and a layer holding one
# whose forward takes an input the contract does not pass is conditioned on that input (diffusers' AdaLayerNorm)
PROJECTIONS = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.modules.conv._ConvNd, torch.nn.Embedding,
               torch.nn.EmbeddingBag, torch.nn.MultiheadAttention, torch.nn.RNNBase)
FILLED = SIZE_NAMES + GROUP_NAMES + EPS_NAMES + MOMENTUM_NAMES + AFFINE_NAMES + BIAS_NAMES + RUNNING_NAMES + \
    IGNORED_NAMES


def is_layer_class(target) -> bool:
    return isinstance(target, type) and issubclass(target, torch.nn.Module)


def is_layer_instance(target) -> bool:
    """A module already built: its sizes are fixed, where a case's vary (normcheck builds one per case)."""
    return isinstance(target, torch.nn.Module)


def is_factory(fn: Callable) -> bool:
    """`fn` returns a configured module: annotated so, or every parameter it requires is one a constructor of a norm
    layer takes (sizes, groups, eps, ...)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    returns = signature.return_annotation
    if is_layer_class(returns) or (isinstance(returns, str) and returns.rsplit(".", 1)[-1] in ("Module", "nn.Module")):
        return True
    required = [p.name for p in signature.parameters.values() if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return bool(required) and all(name.lower() in FILLED for name in required)


class Layer:
    """A layer class or factory called as a function under a contract whose positional parameters are `parameters`
    and whose optional ones, passed by name where a case has them, `optional` (core.loading.contract_arguments: a
    constructor takes those, group_size). `switches`: constructor arguments that make a layer computing several ops
    compute this one (Op.layer_switches). `target`: the class or factory itself, or the `module:attr` spec it is
    loaded from where it runs (a file's module is not importable by name in a worker process). Pickles when its
    target does."""

    def __init__(self, target, parameters: tuple[str, ...], name: str, optional: tuple[str, ...] = (),
                 switches: tuple[tuple[str, Any], ...] = ()):
        self.target, self.parameters, self.name = target, tuple(parameters), name
        self.optional, self.switches = tuple(optional), tuple(switches)
        self._loaded = None
        self.check()

    def __getstate__(self):
        return {"target": self.target, "parameters": self.parameters, "name": self.name, "optional": self.optional,
                "switches": self.switches}

    def __setstate__(self, state):
        self.__dict__.update(state, _loaded=None)

    def __repr__(self):
        return f"Layer({self.name})"

    @property
    def factory(self) -> Callable:
        if self._loaded is None:
            self._loaded = load_callable(self.target) if isinstance(self.target, str) else self.target
        return self._loaded

    @property
    def kind(self) -> str:
        return "constructor" if is_layer_class(self.factory) else "factory"

    @property
    def builder(self) -> Callable:
        """The function whose arguments build the module: the class's constructor or the factory."""
        return self.factory.__init__ if is_layer_class(self.factory) else self.factory

    def _builder_parameters(self) -> list[inspect.Parameter]:
        params = list(inspect.signature(self.builder).parameters.values())
        return params[1:] if is_layer_class(self.factory) else params  # (without self)

    def _filled_parameters(self) -> list[tuple[inspect.Parameter, Callable]]:
        """(parameter, the function it is one of) for every argument a build may fill: the builder's own, then those of
        the constructor its **kwargs passes on to (timm's GroupNorm1: nn.GroupNorm's eps and affine)."""
        own = [(p, self.builder) for p in self._builder_parameters() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return own + [(p, owner) for p, owner in layer_source.reached(self.builder)]

    def check(self) -> None:
        """One-line UsageError now (not on every case) for a constructor with arguments normcheck cannot fill, or a
        forward that takes data the contract does not pass."""
        try:
            params = self._builder_parameters()
        except (TypeError, ValueError):
            return  # (no signature to read: trust it, a failure is a row)
        unknown = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                   and p.name.lower() not in FILLED and p.name not in self.optional]
        if unknown:
            raise UsageError(f"{self.name}: cannot fill its {self.kind}'s argument{'s' * (len(unknown) > 1)} "
                             f"{', '.join(unknown)} (normcheck fills sizes, groups, eps, momentum and the affine and "
                             f"running-statistics switches by name); give a factory that takes the sizes and returns "
                             f"the configured module")
        if is_layer_class(self.factory):
            self._forward_roles(self.factory.forward)
            held = [(n, c.__name__) for n, c in layer_source.constructed(self.builder) if issubclass(c, PROJECTIONS)]
            self._check_conditioning(self.factory.forward, held)  # (before any worker starts, where the source says)

    def _forward_roles(self, forward) -> list[str]:
        """The contract roles a forward's parameters after the input take, in order (UsageError for one it needs
        that the contract does not pass)."""
        try:
            params = list(inspect.signature(forward).parameters.values())
        except (TypeError, ValueError):
            return []
        params = [p for p in params if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        roles = []
        for p in params[1:]:
            role = next((r for r, names in FORWARD_NAMES.items() if p.name.lower() in names and r in self.parameters),
                        None)
            if role is None and p.default is p.empty:
                passed = [r for r in FORWARD_NAMES if r in self.parameters]
                raise UsageError(f"{self.name}: its forward takes {p.name}, which the contract does not pass "
                                 f"(it passes the input{''.join(', ' + r for r in passed)})")
            if role is None:
                break
            roles.append(role)
        return roles

    # -- one call -----------------------------------------------------------------------------------------------
    def for_case(self, case) -> Callable:
        """This layer called on `case` (the torch adapter asks): a constructor takes a number for eps, so a case that
        leaves eps to the dtype (eps=None) gives it the number that means there (Case.eps_value)."""
        return partial(self.__call__, eps_none=case.eps_value if case.eps is None else None)

    def __call__(self, *args, eps_none: float | None = None, **keywords):
        given = dict(zip(self.parameters, args))
        given.update((k, keywords.pop(k)) for k in self.optional if k in keywords)  # (the constructor's: group_size)
        module = self.build(given, eps_none)
        bound = self.bind(module, given)
        forward_keywords = self._keywords(module, keywords)
        data = [given[role] for role in self._forward_roles(module.forward)]
        out = module(given["input"], *data, **forward_keywords)
        self.write_back(bound, given)
        return out

    def build(self, given: dict[str, Any], eps_none: float | None = None) -> torch.nn.Module:
        """The module, made by the constructor or factory with every argument it names that the case fills."""
        arguments, filled = {}, self._filled_parameters()
        params = [p for p, _ in filled]
        named = {p.name.lower() for p in params}
        self._check_written(layer_source.constants(self.builder, _ROLES), given, named, "its")
        for p, owner in filled:
            value = self._argument(p, given, params, eps_none, owner)
            if value is not _LEAVE:
                arguments[p.name] = value
        unfilled = [k for k in self.optional if given.get(k) is not None and k not in arguments]
        if unfilled:  # (the case passes it, group_size=G, and the layer cannot take it)
            raise Unsupported(f"{self.name}'s {self.kind} takes no {', '.join(unfilled)}: the cases that set it are "
                              "not judged")
        module = self.factory(**arguments)
        if not isinstance(module, torch.nn.Module):
            raise UsageError(f"{self.name} returned {type(module).__name__}, not an nn.Module")
        self._check_conditioning(module.forward,
                                 [(n, m) for n, m in module.named_modules() if isinstance(m, PROJECTIONS)])
        module = module.to(given["input"].device)
        training = given.get("training", given.get("use_input_stats", True))
        module.train(bool(training))
        self._check_input_rank(module, given["input"])
        self._check_reduced(module, given)
        self._check_fixed(module, given, named)
        self._check_written(layer_source.written(type(module).forward, _ROLES, added="eps"), given, named,
                            "its forward's")
        return module

    def _argument(self, p: inspect.Parameter, given: dict, params, eps_none: float | None,
                  owner: Callable | None = None) -> Any:
        name = p.name.lower()
        wants_weight, wants_bias = given.get("weight") is not None, given.get("bias") is not None
        has_bias_switch = any(q.name.lower() in BIAS_NAMES for q in params)
        switches = dict(self.switches)
        if p.name in switches:
            return switches[p.name]
        if p.name in self.optional:  # (group_size: None where the case has none, the constructor's default too)
            if given.get(p.name) is not None:
                return given[p.name]
            if p.default is p.empty and given.get("normalized_shape"):  # (one it requires: the whole row, one group,
                return prod(given["normalized_shape"])                  # which is the ungrouped norm: Mamba2's)
            return _LEAVE
        if name in SIZE_NAMES:
            return self._size(p, given, owner or self.builder)
        if name in GROUP_NAMES and "num_groups" in given:
            return given["num_groups"]
        if name in EPS_NAMES and "eps" in given:
            if given["eps"] is None and p.default is not None:  # (its default may not mean "the dtype's")
                if eps_none is None:
                    raise Unsupported(f"{self.name}'s {self.kind} takes a number for {p.name}; the case leaves eps "
                                      "to the dtype (eps=None)", declines={"eps": (None,)})
                return eps_none
            return given["eps"]
        if name in MOMENTUM_NAMES and "momentum" in given:
            return given["momentum"]
        if name in RUNNING_NAMES and "running_mean" in given:
            return given["running_mean"] is not None
        if name in BIAS_NAMES:  # (an op without a bias, RMSNorm's: a layer that can add one must not)
            return wants_bias if "bias" in self.parameters else False
        if name in AFFINE_NAMES:
            if "bias" in self.parameters and not has_bias_switch and wants_weight != wants_bias:
                raise Unsupported(f"{self.name}'s {self.kind} gives weight and bias together ({p.name}); the case has "
                                  f"only the {'weight' if wants_weight else 'bias'}", declines={"affine": ("weight", "bias")})
            if wants_bias and not wants_weight:
                raise Unsupported(f"{self.name}'s {self.kind} cannot give a bias without a weight ({p.name}); the case "
                                  "has only the bias", declines={"affine": ("bias",)})
            return wants_weight or wants_bias
        return _LEAVE

    def _size(self, p: inspect.Parameter, given: dict, owner: Callable):
        """The size a constructor's size argument takes: the normalised shape where the contract passes one (one int
        for an argument that takes one size: layer_source.takes_shape reads which), else the channels."""
        if "normalized_shape" not in given:
            return int(given["input"].shape[1])
        shape = tuple(int(s) for s in given["normalized_shape"])
        if layer_source.takes_shape(owner, p.name, lambda name: name.lower() in SHAPE_NAMES):
            return shape
        if len(shape) != 1:
            raise Unsupported(f"{self.name}'s {self.kind} takes one size ({p.name}): it normalises one dim, the case "
                              f"{len(shape)} dims {shape}", takes={"normalized_dims": (1,)})
        return shape[0]

    def _check_conditioning(self, forward, held: list) -> None:
        """One line for a layer conditioned through a projection (diffusers' AdaLayerNorm: forward(x, timestep=None,
        temb=None), a Linear(D, 2D) making its scale and shift from temb) it `held`s ((attribute, projection)): what
        normcheck cannot bind, said when the layer is given (its constructor's source shows the projection) or on the
        first, tiny case (a factory's module), rather than a SKIP per case after building a projection for each."""
        unpassed = self._unpassed(forward)
        if unpassed and held:
            where, projection = held[0]
            raise UsageError(f"{self.name}: its forward takes {' and '.join(unpassed)}, which the op's contract does "
                             f"not pass, and its {where} ({projection}) projects a conditioning input: normcheck binds "
                             "a norm's own inputs and parameters, not a projection's; judge the norm it holds, or a "
                             "function under the contract of an op with the modulation as inputs (adaln, adagn: scale "
                             "and shift)")

    def _unpassed(self, forward) -> list[str]:
        """The forward's data parameters after the input that no contract role fills."""
        try:
            params = [p for p in inspect.signature(forward).parameters.values() if p.name != "self"
                      and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):
            return []
        return [p.name for p in params[1 + len(self._forward_roles(forward)):]]

    def _check_input_rank(self, module, x: torch.Tensor) -> None:
        """torch's BatchNorm and InstanceNorm classes each take inputs of some ranks (BatchNorm2d: 4-D): another is
        a case the layer does not take, not its bug. A module that holds one such class (a block's norm) takes what
        it takes; one whose forward broadcasts its tensors by a shape it writes (a frozen BatchNorm's
        weight.reshape(1, -1, 1, 1)) or permutes the input's dims in an order it writes (x.permute(0, 2, 3, 1):
        layer_source.written_ranks) takes the ranks that code meets right."""
        written = layer_source.written_ranks(type(module).forward, RANKS)
        if written is not None and x.dim() not in written[0]:
            ranks, said = written
            raise Unsupported(f"{self.name}'s forward is written for its input's rank ({said}): it takes "
                              f"{' or '.join(map(str, ranks)) or 'no'}-D input, the case's is {x.dim()}-D",
                              takes={"rank": ranks})
        checking = module if hasattr(module, "_check_input_dim") else None
        if checking is None:
            held = [m for m in module.modules() if m is not module and hasattr(m, "_check_input_dim")]
            checking = held[0] if len(held) == 1 else None
        if checking is None:
            return
        who = self.name if checking is module else f"{self.name}'s {type(checking).__name__}"
        check, unbatched = checking._check_input_dim, getattr(checking, "_get_no_batch_dim", lambda: None)()
        try:
            check(x)
        except ValueError as e:
            raise Unsupported(f"{who} takes other input ranks ({e})",
                              takes={"rank": _ranks_taken(check, x, unbatched)}) from None
        if x.dim() == unbatched:  # (InstanceNorm2d reads 3-D input as one (C, H, W) sample, not (N, C, L))
            raise Unsupported(f"{who} reads {x.dim()}-D input as one unbatched sample, not (N, C, ...)",
                              declines={"rank": (unbatched,)})

    def _check_reduced(self, module, given: dict) -> None:
        """A forward that reduces over dims it writes as constants (x.pow(2).mean(-1): layer_source.reduced_dims)
        normalises that many dims, whatever shape its constructor took (diffusers' RMSNorm: torch.ones(dim) takes a
        tuple): a case that normalises another number of dims is not the layer's, as for a size argument that takes
        one int (_size)."""
        shape = given.get("normalized_shape")
        reduced = layer_source.reduced_dims(type(module).forward) if shape is not None else None
        if reduced is not None and reduced[0] != len(shape):
            count, said = reduced
            dims = "one dim" if count == 1 else f"{count} dims"
            raise Unsupported(f"{self.name}'s forward reduces over {dims} ({said}): it normalises {dims}, the case "
                              f"{len(shape)} dims {tuple(int(s) for s in shape)}", takes={"normalized_dims": (count,)})

    def _check_fixed(self, module, given: dict, named: set[str]) -> None:
        """A value the case sets that the constructor could not (eps, momentum, a group count) and the module holds
        otherwise."""
        for role, names, field in FIXABLE:
            if role not in given or named & set(names):
                continue
            held = next((getattr(module, n) for n in names if isinstance(getattr(module, n, None), (int, float))
                         and not isinstance(getattr(module, n), bool)), None)
            if held is not None and held != given[role]:
                raise Unsupported(f"{self.name} fixes {role} at {held:g} (its {self.kind} takes no {role}); the case has "
                                  f"{role}={given[role]}", takes={field: (held,)})

    def _check_written(self, written: dict[str, float], given: dict, named: set[str], whose: str) -> None:
        """A value the case sets that the layer's code writes as a constant instead (its builder passes GroupNorm(32,
        C, eps=1e-6); its forward adds 1e-6), where the builder takes no argument of that role: the cases with
        another value are not the layer's (and the sweep narrows to its own)."""
        for role, names, field in FIXABLE:
            if role in written and role in given and not named & set(names) and written[role] != given[role]:
                raise Unsupported(f"{self.name} fixes {role} at {written[role]:g} ({whose} code writes it; its "
                                  f"{self.kind} takes no {role}); the case has {role}={given[role]}",
                                  takes={field: (written[role],)})

    def bind(self, module: torch.nn.Module, given: dict) -> dict[str, tuple[torch.nn.Module, str]]:
        """The case's weight, bias and running statistics put in place of the module's tensors of those roles;
        returns role -> (owning module, attribute) of each bound one."""
        bound = {}
        for role, names in TENSOR_NAMES.items():
            if role not in self.parameters:
                continue
            found = _find(module, names)
            value = given[role]
            if value is None and found is None:
                continue
            if value is None:
                raise Unsupported(f"{self.name} always has a {role} ({found[2]}); the case has none",
                                  takes=_TAKES_WITH.get(role, {}), declines=_WITHOUT.get(role, {}))
            if found is None:
                raise Unsupported(f"{self.name} has no {role} (no parameter or buffer named "
                                  f"{' or '.join(names)}); the case has one", takes=_TAKES_WITHOUT.get(role, {}),
                                  declines=_WITH.get(role, {}))
            owner, attribute, _ = found
            held = getattr(owner, attribute)
            if held.dim() == 0 and tuple(value.shape) == (1,):  # (a scalar gain, ScaleNorm's g: the case's one value)
                value = value.reshape(())
            if tuple(held.shape) != tuple(value.shape):
                raise Unsupported(f"{self.name}'s {role} has shape {tuple(held.shape)}; the case's is "
                                  f"{tuple(value.shape)}")
            store = owner._parameters if attribute in owner._parameters else owner._buffers
            store[attribute] = value
            bound[role] = (owner, attribute)
        return bound

    @staticmethod
    def write_back(bound: dict, given: dict) -> None:
        """A running statistic the layer reassigned (self.running_mean = ...) rather than updated in place: its new
        values into the case's tensor, which the contract updates in place."""
        for role in ("running_mean", "running_var"):
            if role in bound:
                owner, attribute = bound[role]
                now = getattr(owner, attribute)
                if now is not given[role]:
                    with torch.no_grad():
                        given[role].copy_(now)

    def _keywords(self, module, keywords: dict) -> dict:
        """The contract's keywords (fp8's scale, fp8_dtype) where the forward takes them."""
        if not keywords:
            return {}
        try:
            params = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            return keywords
        missing = [k for k in keywords if k not in params]
        if missing and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            raise Unsupported(f"{self.name}'s forward takes no {', '.join(missing)} (the case's fp8 output)")
        return keywords


def _norm_modules(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(dotted name, module) of the module and its submodules outside every projection."""
    inside = [name for name, m in module.named_modules() if name and isinstance(m, PROJECTIONS)]
    return [(name, m) for name, m in module.named_modules()
            if not any(name == p or name.startswith(p + ".") for p in inside)]


_LEAVE = object()  # a constructor argument left to its default
_ROLES = {role: names for role, names, _ in FIXABLE}
# The cases (Case.affine) that give a parameter, and those that do not: what a layer that never (always) has it declines
_WITH = {"weight": {"affine": (True, "weight")}, "bias": {"affine": (True, "bias")}}
_WITHOUT = {"weight": {"affine": (False, "bias")}, "bias": {"affine": (False, "weight")}}
# What a layer that has (has not) running statistics takes: cases that keep them (keep none)
_TAKES_WITH = {"running_mean": {"running_stats": ("yes",)}, "running_var": {"running_stats": ("yes",)}}
_TAKES_WITHOUT = {"running_mean": {"running_stats": ("none",)}, "running_var": {"running_stats": ("none",)}}
# The input ranks a sweep has (ops.design.rank_factor's)
RANKS = (2, 3, 4, 5)


def _ranks_taken(check: Callable, x: torch.Tensor, unbatched: int | None) -> tuple[int, ...]:
    """The input ranks a torch norm class's `_check_input_dim` takes, batched ones only (x's first sizes, ones after)."""
    taken = []
    for rank in RANKS:
        try:
            check(x.new_empty(tuple(x.shape[:2]) + (1,) * (rank - 2)) if rank >= 2 else x)
        except ValueError:
            continue
        if rank != unbatched:
            taken.append(rank)
    return tuple(taken)


def _find(module: torch.nn.Module, names: tuple[str, ...]):
    """(owner, attribute, dotted name) of the one parameter or buffer of the module or its submodules whose own name
    is one of `names`, the first name first (None: none); never one inside a projection (PROJECTIONS: a Linear's
    weight is no norm's)."""
    owners = _norm_modules(module)
    for name in names:
        hits = [(owner, name, f"{prefix}.{name}".lstrip(".")) for prefix, owner in owners
                if name in owner._parameters or name in owner._buffers]
        hits = [h for h in hits if getattr(h[0], h[1]) is not None]
        if hits:
            return hits[0]
    return None
