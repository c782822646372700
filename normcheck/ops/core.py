"""The record types (in the spirit of PyTorch's OpInfo): Op, Impl, Bound and KnownIssue.

An `Op` holds everything generic code needs about one op; an `Impl` is one implementation of an
op (torch's, our kernels, a recipe, a user's function), whoever registers it, as it is declared; a `Bound`
is one bound to the world it runs in, which the engine judges; a `KnownIssue` is a
recorded failure of code that is not ours to fix. Records are frozen data: `__post_init__`
validates them, generic code reads them, nothing outside a record branches on an op's name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from math import inf
from typing import Any, Callable

import numpy as np

from ..core.errors import UsageError
from ..core.loading import load_callable, spec_of
from ..numerics.dtypes import COMPUTE_DTYPES, OUTPUT_DTYPES
from ..numerics.formats import expressible
from ..numerics.sets import SetView
from ..reference.stages import AFTER, BEFORE
from .design import Composed, Design, compose
from .layouts import BATCH, SHARDED, Layout

ALL_CASES = "all dtypes (f64, f32, f16, bf16, mixed), all memory formats, every rank the op takes"
CONVENTIONS = ("contract", "direct")
# The "direct" contract of a function in a framework without autodiff (NumPy): it returns every output itself
DIRECT_SIGNATURE = ("fn(case, inputs) -> {output name: array}  (y, the saved statistics and the gradients the case asks "
                    "for, from the case's float64 master copies: inputs.x, inputs.dy, inputs.weight, ...)")
_OUTPUT_DTYPE_MEANS = {"input": "x's dtype",
                       "promote": "result_type over x and the parameters and buffers the case uses"}
SECOND_ORDER_OUTPUTS = ("d2x", "d2weight", "d2dy")  # of order-2 cases (Case.directional: those not identically 0)
TANGENT_OUTPUTS = {"jvp_y": "y", "jvp_dx": "dx", "jvp_dweight": "dweight"}  # of forward-mode cases -> their primal
JVPS = tuple(TANGENT_OUTPUTS)
SECOND_DERIVATIVES = SECOND_ORDER_OUTPUTS + ("jvp_dx", "jvp_dweight")  # order 2's, and fwd-rev's (the gradients' JVPs)
# The outputs that are directional derivatives -> the formula of reference.setwise that gives them (at order 2 the
# gradient of ⟨t, ∇f⟩ is, by the Hessian's symmetry, the forward-mode derivative of ∇f along t; y's JVP is d2dy)
DIRECTIONAL = {**{name: name for name in SECOND_ORDER_OUTPUTS}, "jvp_y": "d2dy", "jvp_dx": "d2x",
               "jvp_dweight": "d2weight"}
ALL_ORDERS = (1, 2, "fwd", "fwd-rev")  # Case.order: the backward, the double backward, forward and forward-over-reverse
FORWARD_ORDERS = ("fwd", "fwd-rev")
X_SHAPED = ("y", "dx", "d2x", "d2dy", "jvp_y", "jvp_dx")  # outputs shaped like x, in its dtype (a tangent: its primal's)
# The first-order gradients every op with those inputs defines, and the input each is taken with respect to
GRADIENTS = {"dx": "x", "dweight": "weight", "dbias": "bias"}
RUNNING = ("running_mean", "running_var")  # the running statistics a training step updates in place
OPERAND_ROLES = ("input", "cotangent")


@dataclass(frozen=True)
class Operand:
    """A tensor an op takes beyond x, dy and its affine parameters, declared by its record (add + RMSNorm's
    residual, and the cotangent dh of the residual stream it returns; adaln's per-sample scale and shift). `dtype`:
    "input" (x's), "param" (the parameters'), or a function of the case that names it (add + norm's residual
    stream: its case field residual_dtype); `shape`, `draw` and `derive` below say its shape and values.
    `gradient`: the gradient a data input defines (asked for unless the case freezes x: the data inputs are frozen
    together); `of`: the output a cotangent belongs to."""
    name: str
    role: str = "input"
    dtype: "str | Callable[[Any], str]" = "input"
    gradient: str | None = None
    of: str | None = None
    # "x": shaped and laid out like x (a data input) or dy (a cotangent); or a function of the case giving its
    # shape (adaln's per-sample scale: (N, *normalized_shape)), made contiguous
    shape: "str | Callable[[Any], tuple[int, ...]]" = "x"
    # How a case draws its values: None, from the case's profile like x (a data input) or like dy (a cotangent);
    # or draw(rng, shape) -> float64 values (then quantised to its dtype)
    draw: "Callable[[Any, tuple[int, ...]], np.ndarray] | None" = None
    # Or made from the case's other inputs once they are made: derive(case_inputs) -> float64 values (then quantised
    # to its dtype), as fp8's scale is from y's range
    derive: "Callable[[Any], np.ndarray] | None" = None

    def __post_init__(self):
        if self.role not in OPERAND_ROLES:
            raise ValueError(f"operand {self.name}: role {self.role!r} is not one of {', '.join(OPERAND_ROLES)}")
        if (self.role == "cotangent") != (self.of is not None) or (self.role == "cotangent" and self.gradient):
            raise ValueError(f"operand {self.name}: a cotangent names the output it belongs to, and nothing else does")


@dataclass(frozen=True)
class Result:
    """An output an op returns besides y (add + RMSNorm's residual stream h), shaped like x unless `shape` says
    otherwise, in `dtype` (as an Operand's), differentiated with the cotangent operand named `cotangent` (None: not
    differentiable)."""
    name: str
    dtype: "str | Callable[[Any], str]" = "input"
    cotangent: str | None = None
    shape: "str | Callable[[Any], tuple[int, ...]]" = "x"  # as an Operand's


@dataclass(frozen=True)
class Extension:
    """What a case field adds to an op's interface in the cases that set it (not None, or one of `values`): operands the contract passes
    and results it returns after y and the op's own results (LayerNorm's and RMSNorm's fp8 output: a scale in, the
    quantised y and its amax out). Generic code reads Op.operands_of(case) / results_of(case); `operands` and
    `results` stay the interface every case has. A record built from this one with a reference of its own
    (add + norm's) has neither the extension nor its field (Op.fields_without_extensions)."""
    field: str
    operands: tuple[Operand, ...] = ()
    results: tuple[Result, ...] = ()
    # Element-wise stages it adds after the norm where it applies (reference.stages: fp8's quantising cast), whose
    # reference and bounds compose as a fused op's (ops.fused.reference_of, engine.stage_bounds)
    stages: tuple = ()
    # The field's values that add them (empty: any but None): add + norm's residual stream h is returned, and dh
    # taken, where its field `returns` is "y,h", not in the form that returns y alone
    values: tuple = ()

    def applies(self, case) -> bool:
        value = getattr(case, self.field, None)
        return value is not None and (not self.values or value in self.values)


# A label shows a field with this quiet value always (GroupNorm's groups, LayerNorm's K: a case's geometry)
ALWAYS = object()
# A generated case draws the field among its declared choices (CaseField.draw)
AMONG_CHOICES = "among its choices"


@dataclass(frozen=True)
class CaseField:
    """A case field an op declares beyond those every case has (GroupNorm's groups, RMSNorm's casting chain, add +
    norm's residual dtype, fp8 output): its default on that op, what it means, the values it takes and how a case's
    label shows it. Declared once, where its meaning lives, and listed by each record that takes it (Op.fields);
    the Case attribute of that name holds its value, and the CLI's options, the pytest plugin's and the case labels
    follow from the declaration. A `convention` is a promise about what an implementation computes (Impl.follows:
    every case it is judged on has its value); otherwise the field is a property of the inputs the caller passes
    (geometry, the residual stream's dtype), a factor the sweep covers (docs/architecture.md has the rule). A `defaulted` one left None
    takes the op's default (GroupNorm's groups are not: a count that divides C is the caller's)."""
    name: str
    default: Any
    help: str                              # what it says, after the names of the ops that take it
    choices: tuple = ()                    # the values it takes (empty: whatever `parse` makes of the text)
    parse: Callable[[str], Any] = str      # the text of an option -> the value
    metavar: str | None = None
    label: str = "{}"                      # how a case label shows a value
    quiet: Any = None                      # the value a label leaves unsaid (the convention most code follows)
    convention: bool = True
    defaulted: bool = True
    # A convention's values a failing row is judged again under (engine.hints; None: its choices): weight_offset's
    # 0 and 1, none for fp8 (it changes the interface, not how the layer is defined)
    probes: tuple | None = None
    # What an implementation following each value does, as a hint says it ("scales by 1 + w"); a dict is accepted
    meanings: tuple[tuple[Any, str], ...] = ()
    # A hint judges the row's own call against this field's value's expectations (engine.hints): declaring it says the
    # implementation computes them whatever the case asks, not that it does when asked (a frozen BatchNorm normalises
    # with its running statistics in training mode too; a BatchNorm with a float64 bug there passes eval mode as well)
    as_called: bool = False
    # How a generated case (cases.strategies) draws it: AMONG_CHOICES; draw(shape, op) -> the values to draw among
    # (a geometry the shape bounds: GroupNorm's groups, LayerNorm's K); or None, not drawn: the implementation's to
    # say (fp8 output, channels-first sets, who reduces a parallel norm's gradients)
    draw: Any = None

    def __post_init__(self):
        if isinstance(self.meanings, dict):
            object.__setattr__(self, "meanings", tuple(self.meanings.items()))

    def candidates(self, shape: tuple[int, ...], op) -> tuple:
        """The values a generated case of `op` with `shape` draws among (empty: it is not drawn)."""
        if self.draw is None:
            return ()
        return tuple(self.choices if self.draw == AMONG_CHOICES else self.draw(shape, op))

    @property
    def probed(self) -> tuple:
        """The values a hint search tries (engine.hints)."""
        return self.choices if self.probes is None else self.probes

    def meaning(self, value) -> str:
        """What an implementation that follows `value` does, in a clause."""
        return dict(self.meanings).get(value, f"follows {self.name}={value}")

    @property
    def option(self) -> str:
        return self.name.replace("_", "-")

    def value(self, text: str):
        """The value an option's text gives; UsageError (one line) for one the field does not take."""
        try:
            value = self.parse(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(self.parse, f"a {self.parse.__name__}")
            raise UsageError(f"{self.option} must be {kind}, got {text!r}") from None
        self.check(value)
        return value

    def check(self, value) -> None:
        if value is not None and self.choices and value not in self.choices:
            raise UsageError(f"unknown {self.option} {value!r}; choose one of {', '.join(map(str, self.choices))}")

    def shown(self, value) -> str | None:
        """How a case label shows `value` (None: not at all)."""
        return None if value is None or (self.quiet is not ALWAYS and value == self.quiet) else self.label.format(value)

    def same_meaning(self, other: "CaseField") -> bool:
        """The same field, whatever default each op gives it."""
        return replace(self, default=None) == replace(other, default=None)


# The conventions every op takes, declared like an op's own (Case has them as attributes of its own, and the CLI's
# --output-dtype / --compute-dtype): what a hint reads of them (Op.conventions)
OUTPUT_DTYPE = CaseField("output_dtype", "input", "the dtype y comes back in", choices=OUTPUT_DTYPES, meanings={
    "input": "returns y in x's dtype",
    "promote": "returns y as result_type over x and its parameters and buffers"})
COMPUTE_DTYPE = CaseField("compute_dtype", "f64", "the finest precision the layer computes in", choices=COMPUTE_DTYPES,
                          meanings={"f64": "computes as finely as its input (float64 for float64 input)",
                                    "f32": "computes in float32 at most"})
# Not a convention but the path, which the run narrows (--mode eval): a hint tries it on a training-mode row of an op with
# running statistics, for a layer that always normalises with them (a frozen BatchNorm has no training mode)
MODE = CaseField("mode", "train", "the path: batch statistics (train) or the running ones (eval)",
                 choices=("train", "eval"), convention=False, probes=("eval",), as_called=True, meanings={
                     "eval": "always normalises with its running statistics, as a frozen BatchNorm does"})


@dataclass(frozen=True)
class Signature:
    """What a failure a known issue explains looks like: which tensors go wrong and how (finite errors
    up to `max_ratio` budget ratios, NaN/Inf where the reference is finite if `nonfinite`), or, for a
    case that fails before any tensor is compared, the `message` (a regex) it fails with."""
    tensors: tuple[str, ...] = ()
    max_ratio: float = inf
    nonfinite: bool = False
    message: str | None = None

    def explains_tensor(self, t) -> bool:
        if t.name.split("[")[0] not in self.tensors:
            return False
        return self.nonfinite if t.nonfinite_mismatches else t.max_ratio <= self.max_ratio

    def explains_message(self, message: str) -> bool:
        return self.message is not None and re.search(self.message, message) is not None


@dataclass(frozen=True)
class KnownIssue:
    """A failure of someone else's code (torch's) that normcheck found: the cases it covers, the
    signature of the failure it explains, and the aten ops whose kernels have it (`code`: the issue
    follows those kernels into any implementation that calls them). `devices`: the device types whose kernels it
    was found in (torch's CPU kernels and its CUDA kernels are different code: an issue of one never excuses a
    failure on the other)."""
    key: str
    summary: str
    applies: Callable[[Any], bool]
    signature: Signature
    code: tuple[str, ...] = ()
    devices: tuple[str, ...] = ("cpu",)

    def covers(self, device: str) -> bool:
        """Recorded for the kernels of `device` (cpu, cuda:1, ...: its type)."""
        return device.split(":")[0] in self.devices


BATCH_INVARIANCE = "batch-invariance"
CHECKS = (BATCH_INVARIANCE,)


def rows_dependence(case) -> str | None:
    """Why `case`'s rows depend on each other (None: independent, and batch invariance is defined)."""
    if case.record.distributed:
        return "the op's world splits one batch over its ranks: a row's outputs are the world's"
    return case.record.rows_depend(case)


def native_output_mask(case) -> list[bool]:
    """The output_mask of aten's native backward ops: the gradients the case asks for (Case.grads)."""
    return [name in case.grads for name in ("dx", "dweight", "dbias")]


def supports_everything(case) -> str | None:
    return None


@dataclass(frozen=True)
class Impl:
    """One implementation under test.

    `target` is the code: a function, or a `module:attr` spec loaded where it runs (how it reaches
    a gloo worker). Its `convention` says how it is called: "contract" — the op's public `--impl`
    contract, gradients from the framework's autodiff; "direct" — `target(case, tensors)` returns
    every output itself (the native backward ops called directly, the NumPy baseline). It runs in
    `world` unless told otherwise (None: its op's default world); `worlds` lists the worlds it can
    run in (empty: any). What it declares only: the catalogue binds it to a world (`Bound`).
    """
    name: str
    op: str
    description: str
    target: Callable | str
    convention: str = "contract"
    framework: str = "torch"
    world: str | None = None
    worlds: tuple[str, ...] = ()
    supports: Callable[[Any], "str | None"] = supports_everything  # None, or why a case is skipped
    capabilities: str = ALL_CASES
    known_issues: tuple[KnownIssue, ...] = ()
    threads: int | None = None          # the framework's intra-op threads while it runs
    path: Callable[[Any], str] | None = None  # the code path it took on the case it just ran
    prepare: Callable[[], Any] | None = None  # readies the code (a C++ build) before its first case in a process
    # The case fields whose meaning the implementation fixes (RMSNorm: its weight offset and casting
    # chain): every case it is judged on has them. Pairs (field, value); a dict is accepted.
    follows: tuple[tuple[str, Any], ...] = ()
    modes: tuple[str, ...] = ("train", "eval")  # the modes it implements (of those its op has)
    # The derivative orders it can be judged at (Case.order). None: every one through autograd ("contract": 1, 2,
    # fwd, fwd-rev); 1 for "direct", which returns first-order gradients itself. A contract implementation found
    # only once differentiable, or without a forward-mode formula, when it runs is a SKIP too (NotDifferentiable).
    orders: tuple[int | str, ...] | None = None
    deterministic: bool = True  # the same inputs give bitwise the same outputs (each case is run twice)
    # The memory formats it can express, x and dy alike (None: every one). Arrays (JAX, TensorFlow) have no
    # strides: their axis order is their only layout. Its sweeps take the standard layout for the others.
    formats: tuple[str, ...] | None = None
    # The properties it promises beyond the reference's values, checked on every case (CHECKS; the run's --check adds
    # to them): batch-invariance, its rows' outputs bitwise the same in any batch (engine.invariance)
    checks: tuple[str, ...] = ()
    # How it can lay out a distributed case's split (None: any shares): (extent, ranks) -> the one split of that extent
    # over that many ranks it expresses (DTensor: torch.chunk's). Its sweeps take those shares; other splits it skips.
    shares: Callable[[int, int], tuple[int, ...]] | None = None
    shares_why: str = ""  # why it has only those (a message names it)
    # The torch adapter may watch the aten ops it runs (a TorchDispatchMode, which known issues follow). False for
    # compiled code: under a dispatch mode torch.compile silently runs the function eagerly.
    dispatch_mode: bool = True

    def __post_init__(self):
        if self.orders is None:
            object.__setattr__(self, "orders", ALL_ORDERS if self.convention == "contract" else (1,))
        if isinstance(self.follows, dict):
            object.__setattr__(self, "follows", tuple(self.follows.items()))
        if self.convention not in CONVENTIONS:
            raise UsageError(f"Impl {self.name}: convention {self.convention!r} is not one of {', '.join(CONVENTIONS)}")
        if not (callable(self.target) or isinstance(self.target, str)):
            raise UsageError(f"Impl {self.name}: target must be a function or a module:attr spec")

    def callable(self) -> Callable:
        return load_callable(self.target) if isinstance(self.target, str) else self.target

    def checking(self, names) -> "Impl":
        """This record with the checks `names` added to those it promises (a run's --check)."""
        return replace(self, checks=tuple(dict.fromkeys(self.checks + tuple(names))))

    def check_declared(self, conventions: dict, option: str = "--") -> None:
        """A convention a run declares (`option`: how its options begin) is the one this record follows, where it
        follows one."""
        for name, value in self.follows:
            if conventions.get(name, value) != value:
                raise UsageError(f"{option}{name.replace('_', '-')} {conventions[name]}: {self.name} follows "
                                 f"{name}={value}")

    def declaring(self, conventions: dict) -> "Impl":
        """This record following `conventions` too (a run's convention options, once checked against its own): a
        convention it follows is declared, so a hint never judges it otherwise."""
        return replace(self, follows=tuple({**dict(self.follows), **conventions}.items()))

    @property
    def spec(self) -> str:
        """The `module:attr` the target is importable under (ranks in other processes load it)."""
        return self.target if isinstance(self.target, str) else spec_of(self.target)

    def reported_path(self, case) -> str:
        """The code path the implementation says it took on the case it just ran ('' if it says none)."""
        return str(self.path(case) or "") if self.path is not None else ""

    def unsupported(self, case) -> str | None:
        """Why this implementation, in the world it declares, skips `case` (None: it takes it); a bound one's
        (Bound.unsupported) is in the world it was bound to."""
        return self.declines(case, self.world) or self.supports(case)

    def declines(self, case, world: str | None) -> str | None:
        """Why what this record declares refuses `case` in `world` (None: nothing does), its support rule aside."""
        if self.worlds and world not in self.worlds:
            return f"{self.name} runs in the {' or '.join(self.worlds)} world, not {world}"
        if not expressible(self.formats, case.x_format, case.dy_format):
            return (f"{self.name} takes x and dy in one layout, {' or '.join(self.formats)} (the case has "
                    f"{case.x_format}/{case.dy_format}): its arrays have no strides, only an axis order")
        if BATCH_INVARIANCE in self.checks and (why := rows_dependence(case)):
            return f"batch invariance is not defined here: {why}"
        if self.shares is not None and case.split is not None:
            extent = case.record.layout.extent(case.shape)
            only = self.shares(extent, len(case.split))
            if case.split != only:
                return (f"{self.name} splits {extent} over {len(case.split)} ranks as {','.join(map(str, only))} only "
                        f"({self.shares_why})")
        for name, value in self.follows:
            if getattr(case, name) != value:
                return f"{self.name} follows {name}={value} (the case has {getattr(case, name)})"
        if case.mode not in self.modes:
            return f"{self.name} implements {' and '.join(self.modes)} mode only"
        if case.order != 1 and not case.record.double_backward:
            return f"{self.name} is not judged at order {case.order} here: {case.record.why_once_differentiable}"
        if case.order not in self.orders:
            how = "it returns first-order gradients itself" if self.convention == "direct" else "as recorded"
            if case.order == 2 or 2 not in self.orders:
                return f"{self.name} is only once differentiable ({how})"
            return f"{self.name} has no forward-mode derivatives ({how})"
        return None

    def applicable_issues(self, case, ops_called=frozenset(), of_op: tuple[KnownIssue, ...] = (),
                          device: str = "cpu") -> list[KnownIssue]:
        """The known issues that may explain a failure on `case`: the record's own, and those of its op
        whose kernels (`code`) the run called, recorded for the kernels of `device` (where it ran: Bound.device)."""
        issues = list(self.known_issues) + [k for k in of_op if k not in self.known_issues and set(k.code) & ops_called]
        return [k for k in issues if k.covers(device) and k.applies(case)]


@dataclass(frozen=True)
class Bound:
    """An implementation bound to a world (impls.catalogue.bind): the record as declared (`impl`) and what binding
    attaches, which judging one (engine.judge) reads. Every declared fact is read off `impl`, but for the three
    every message and dispatch names (`name`, `op`, `framework`)."""
    impl: Impl
    world: str  # the world it runs in (its record's default, or the run's --backend)
    # runner(case, inputs, runs=1) -> worlds.core.Run (outputs, path, ops, and what a later run changed); None in the
    # worker process that runs it (worlds.workers: its framework adapter is the run)
    runner: Callable | None = field(default=None, compare=False, repr=False)
    # Where a torch implementation's case tensors live (the run's --device: cpu, cuda, cuda:1, mps, ...); a
    # distributed world's own device
    device: str = "cpu"
    # The run's --triton-interpret: its worker process runs Triton kernels in Triton's interpreter (TRITON_INTERPRET=1
    # there before the implementation is imported), and `supports` adds what that cannot run
    triton_interpret: bool = False
    # A witness's (torch's record run to reproduce a known issue met by other code) where the code failed by its
    # values: they are what is asked of it, and its outputs' dtypes are not checked (the torch adapter's to_numpy).
    # Its forward-mode tangent of f16/bf16 y may be float32 (torch-ln-jvp-mixed-dtype) where code that moves y back
    # through a view gets it in y's dtype: that raised, and hid the gradients in which timm's LayerNorm2d had met
    # torch-ln-half-forward-ad
    values_only: bool = False
    # The support rule it is judged under (None: the record's own; frameworks.torch.triton.Interpreted adds the
    # interpreter's gaps to it)
    supports: Callable[[Any], "str | None"] | None = None
    # A picklable callable that rebuilds this record in a worker process (None: it cannot)
    portable: Callable[[], "Bound"] | None = field(default=None, compare=False, repr=False)
    limit: Any = field(default=None, compare=False, repr=False)  # the bound run's CaseLimit
    # issue -> the bound record of torch's that a known issue is recorded on and that takes the case (None: none),
    # whose outputs tell whether a failure of code that called torch's kernel is torch's
    # (values_only=True: one bound so, for a failure of values)
    witness: Callable[..., "Bound | None"] | None = field(default=None, compare=False, repr=False)
    # The bound run's hint search (engine.hints.HintSearch: mutable, shared by the records made from this one), which
    # judges a failing row again under the conventions it did not declare; None: no hints
    hints: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.supports is None:
            object.__setattr__(self, "supports", self.impl.supports)

    @property
    def name(self) -> str:
        return self.impl.name

    @property
    def op(self) -> str:
        return self.impl.op

    @property
    def framework(self) -> str:
        return self.impl.framework

    def checking(self, names) -> "Bound":
        """This binding of the record with the checks `names` added (Impl.checking)."""
        return replace(self, impl=self.impl.checking(names))

    def declaring(self, conventions: dict) -> "Bound":
        """This binding of the record following `conventions` too (Impl.declaring)."""
        return replace(self, impl=self.impl.declaring(conventions))

    def unsupported(self, case) -> str | None:
        """Why this implementation, in the world it is bound to, skips `case` (None: it takes it)."""
        return self.impl.declines(case, self.world) or self.supports(case)

    def applicable_issues(self, case, ops_called=frozenset(), of_op: tuple[KnownIssue, ...] = ()) -> list[KnownIssue]:
        """The known issues that may explain a failure on `case` on the device it runs on (Impl.applicable_issues)."""
        return self.impl.applicable_issues(case, ops_called, of_op, self.device)


@dataclass(frozen=True)
class Op:
    name: str
    description: str
    signature: str                      # the public contract for `--impl module:attr`
    call: Callable                      # call(fn, tensors, case, group, world_size) -> y, under `signature`
    reference: Callable[[Any], dict[str, np.ndarray]]  # CaseInputs -> float64 outputs
    view: Callable[[Any], SetView]      # case -> its normalisation sets and affine axes
    unit: str                           # what reports break ratios down by: "channel" or "group"
    outputs: tuple[str, ...]            # every output the reference defines
    required: tuple[str, ...]           # outputs every implementation must produce (dweight/dbias if affine)
    sweep: Design                       # its factors and how they make a shape (normcheck.ops.design)
    saved_stats: tuple[str, ...] = ()   # outputs that may come back in any float dtype
    running_stats: bool = False         # a training step updates running_mean/running_var
    distributed: bool = False           # cases split the batch over the ranks of a world
    world: str = "isolated"             # where user implementations of this op run by default
    fields: tuple[CaseField, ...] = ()  # the op's own case fields (CaseField), each with its default on this op
    set_dim: int = 0                    # a dim every normalisation set spans (strategies grow it)
    validate: Callable[[Any], None] = lambda case: None  # op-specific checks of a case (UsageError)
    impls: tuple[Impl, ...] = ()        # torch's own implementations, with their known issues
    default_impl: str = "torch"
    params: tuple[str, ...] = ("weight", "bias")  # the affine parameters it takes (RMSNorm: no bias)
    centred: bool = True                # statistics about the set's mean (False: RMSNorm's mean of squares)
    eps_none: Callable[[str], float] | None = None  # what eps=None means in a precision computed in (None: not allowed)
    eps_zero: tuple[str, ...] = ("train", "eval")  # the modes in which eps = 0 is legal (BatchNorm: eval only)
    min_set_size: int = 2               # fewest values a set may have (BatchNorm's running variance needs 2)
    ranks: tuple[int, ...] = (2, 3, 4, 5)  # the input ranks it takes (InstanceNorm: none without spatial dims)
    # Its order-2 cases (the double backward) and forward-mode ones (fwd, fwd-rev: the same directional-derivative
    # formulas, reference.setwise) are judged; else every implementation skips them, saying why
    double_backward: bool = True
    why_once_differentiable: str = ""
    # Why a case's rows (dim 0) depend on each other, so that batch invariance is not defined for it (None: they are
    # independent: a row's x-shaped outputs depend on that row alone). A distributed op's rows are split by its world.
    rows_depend: Callable[[Any], "str | None"] = lambda case: None
    eval_keyword: str | None = None     # the keyword its contract adds in eval mode (SyncBN: training=False)
    # Its contract for array frameworks (JAX, TensorFlow): pure functions of arrays, the layout's keywords
    # passed by name (frameworks.arrays.ArrayInputs); None: it has none yet
    array_signature: str | None = None
    array_call: Callable | None = None  # array_call(fn, array_inputs, case) -> y, or (y, running_mean, running_var)
    channels: bool = True               # it has a channel axis a layer may take last (NHWC); False: LayerNorm's rows
    # Its interface beyond x, dy and the parameters (a fused op's): the tensors it takes and those it returns after
    # y; under its contract `call` passes the operands and gets (y, *results) back
    operands: tuple[Operand, ...] = ()
    results: tuple[Result, ...] = ()
    # What a case field adds to that interface where a case sets it (Extension: fp8's scale, y_fp8 and amax)
    extensions: tuple[Extension, ...] = ()
    # A fused op: an inner norm (`inner`, the name of its record) with element-wise stages before and after it
    # (reference.stages: a sum of inputs, a scale by an operand through a function, an activation), built by
    # ops.fused; its reference, baseline and tolerance are composed from them
    stages: tuple = ()
    inner: str | None = None
    # How a distributed op's cases are laid out over the ranks (ops.layouts: which axis the split divides, what each
    # rank holds of γ and β, how the ranks' outputs are assembled); a distributed op without one has SyncBN's, BATCH
    layout: Layout | None = None
    laid_out_from: str | None = None  # a parallel op: the single-process op it lays out over a world (its layout's name)
    # Constructor arguments, by name, that make a layer class computing several ops compute this one, where it is
    # given by class (Mamba2's gated norms: norm_before_gate=False puts the gate before the norm)
    layer_switches: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.distributed and self.layout is None:
            object.__setattr__(self, "layout", BATCH)
        names = {i.name for i in self.impls}
        if len(names) != len(self.impls) or any(i.op != self.name for i in self.impls):
            raise ValueError(f"op {self.name}: implementations must be unique and of this op")
        if not set(self.required) <= set(self.outputs) or not set(self.saved_stats) <= set(self.outputs):
            raise ValueError(f"op {self.name}: required and saved outputs must be outputs")
        declared = {o.name for o in self.operands}
        for r in self.results:
            if r.name not in self.outputs or (r.cotangent is not None and r.cotangent not in declared):
                raise ValueError(f"op {self.name}: result {r.name} must be an output, its cotangent an operand")
        if not set(self.gradients) <= set(self.outputs) | set(GRADIENTS):
            raise ValueError(f"op {self.name}: its operands' gradients must be outputs")
        if self.stages and self.inner is None:
            raise ValueError(f"op {self.name}: a fused op's stages are around an inner norm (inner)")
        before = [s for s in self.stages if s.side == BEFORE]
        after = [s for s in self.stages if s.side == AFTER]
        apart = [s for s in before[:-1] + after[1:] if s.adjacent]  # (a stage whose bound reads the norm's own)
        if apart:
            raise ValueError(f"op {self.name}: a {apart[0].kind} stage is bounded next to the norm only (the last stage "
                             "before it, the first after it)")
        if self.running_stats and {s.kind for s in self.stages} - {"activation"}:
            raise ValueError(f"op {self.name}: eval mode composes an activation after the norm only")

    def __hash__(self) -> int:
        # (the sweep's caches are keyed by the record: its name, not every field's hash, on each call)
        return hash(self.name)

    @cached_property
    def design(self) -> Composed:
        """Its whole design: the shared factors, exclusions and anchors with its own (`sweep`), composed once."""
        return compose(self)

    @property
    def epilogue(self):
        """The element-wise function of an activation stage after the norm (reference.stages.ElementFunction; None:
        none), which eval mode's formulas apply (reference.setwise.eval_mode)."""
        return next((s.fn for s in self.stages if s.kind == "activation"), None)

    @property
    def gradients(self) -> dict[str, str]:
        """Every first-order gradient the op defines -> the input it is taken with respect to."""
        own = {g: wrt for g, wrt in GRADIENTS.items() if wrt == "x" or wrt in self.params}
        return {**own, **{o.gradient: o.name for o in self.operands if o.gradient}}

    def dtype_of(self, case, role: str) -> str:
        """The dtype an operand or result declared as `role` has in `case` (Operand.dtype)."""
        if callable(role):
            return role(case)
        return case.param_dtype if role == "param" else case.dtype

    def _declared(self, name: str) -> "Result | Operand | None":
        """The declaration of a result, or of the operand a declared gradient is taken of (None: not declared)."""
        for r in self.results + tuple(r for e in self.extensions for r in e.results):
            if r.name == name:
                return r
        return next((o for o in self.operands if o.gradient == name), None)

    @property
    def case_fields(self) -> dict[str, Any]:
        """Its own case fields' names -> their defaults on this op."""
        return {f.name: f.default for f in self.fields}

    @property
    def conventions(self) -> tuple[CaseField, ...]:
        """The declarations of every convention its cases have: its own convention fields, then every op's."""
        return tuple(f for f in self.fields if f.convention) + (OUTPUT_DTYPE, COMPUTE_DTYPE)

    @property
    def hinted(self) -> tuple[CaseField, ...]:
        """What a FAIL's hint judges its case again under (engine.hints): its conventions, and eval mode where it keeps
        running statistics."""
        return self.conventions + ((MODE,) if self.running_stats else ())

    # -- one case's interface: the op's own, and what the extensions whose field the case sets add
    def fields_without_extensions(self) -> tuple[CaseField, ...]:
        """Its case fields without those its extensions add: the case fields of a record built from this one that
        gives its own reference (add + norm, adaln), which then has no extensions (their results are this one's)."""
        added = {e.field for e in self.extensions}
        return tuple(f for f in self.fields if f.name not in added)

    def operands_of(self, case) -> tuple[Operand, ...]:
        return self.operands + tuple(o for e in self.extensions if e.applies(case) for o in e.operands)

    def results_of(self, case) -> tuple[Result, ...]:
        return self.results + tuple(r for e in self.extensions if e.applies(case) for r in e.results)

    def stages_of(self, case) -> tuple:
        """Its stages on `case`: a fused op's own, then those its extensions add where they apply."""
        return self.stages + self.extension_stages(case)

    def extension_stages(self, case) -> tuple:
        """The stages its extensions add on `case` (fp8 output's quantising cast)."""
        return tuple(s for e in self.extensions if e.applies(case) for s in e.stages)

    def x_shaped_outputs(self, case) -> tuple[str, ...]:
        """The outputs shaped like x on `case`: y, dx, its x-shaped results and the gradients of its x-shaped data
        inputs (a sharded world joins these along its split axis)."""
        return (("y", "dx") + tuple(r.name for r in self.results_of(case) if r.shape == "x")
                + tuple(o.gradient for o in self.operands_of(case) if o.gradient and o.shape == "x"))

    def outputs_of(self, case) -> tuple[str, ...]:
        """Every output `case` may compare: all_outputs, and its extensions' results (no running statistics where the
        case keeps none)."""
        return tuple(name for name in self.all_outputs + tuple(r.name for r in self.results_of(case)
                                                               if r.name not in self.all_outputs)
                     if self.tracks(case) or name not in RUNNING)

    def required_of(self, case) -> tuple[str, ...]:
        """What every implementation must produce on `case`: `required`, and its extensions' results (no running
        statistics where the case keeps none)."""
        return tuple(name for name in self.required + tuple(r.name for r in self.results_of(case)
                                                            if r.name not in self.required)
                     if self.tracks(case) or name not in RUNNING)

    def tracks(self, case) -> bool:
        """`case` keeps running statistics: the op has them and the case does not say it keeps none."""
        return self.running_stats and case.running_stats != "none"

    def _declared_dtype(self, name: str) -> str | None:
        """The dtype role of a declared result, or of a declared operand's gradient (None: not declared)."""
        declared = self._declared(name)
        return None if declared is None else declared.dtype

    def shape_of(self, case, role, x_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape an operand or result declared with shape `role` has in `case` (x's: `x_shape`)."""
        return tuple(x_shape) if role == "x" else tuple(role(case))

    def output_dtype(self, case, name: str) -> str:
        """The storage dtype an output is expected in: y promoted under output_dtype=promote (result_type over x
        and every floating parameter and buffer the layer uses in the case, promotes_through: a mixed case's f32; the
        input's when it uses none). A tangent: its primal's."""
        name = TANGENT_OUTPUTS.get(name, name)
        if name == "y" and case.output_dtype == "promote" and self.promotes_through(case):
            return case.param_dtype  # (the wider of the two: a case's parameters are never narrower than x)
        if self._declared_dtype(name) is not None:
            return self.dtype_of(case, self._declared_dtype(name))
        if name in X_SHAPED:
            return case.dtype
        if name in self.saved_stats:
            return case.dtypes.moments
        return case.param_dtype

    def promotes_through(self, case) -> tuple[str, ...]:
        """The tensors in the parameter dtype that the layer computes y from in `case` (what output_dtype=promote
        promotes x with): its weight and bias where given, and the running statistics where it normalises with
        them (eval mode; a training step only updates them)."""
        running = ("running_mean", "running_var") if self.running_stats and not case.training else ()
        return ("weight",) * case.has_weight + ("bias",) * case.has_bias + running

    def dtype_note(self, case, name: str, got: str) -> str:
        """What to declare when an output came back in `got`, the dtype another output-dtype convention gives
        ('' when none does)."""
        for convention, means in _OUTPUT_DTYPE_MEANS.items():
            if name == "y" and convention != case.output_dtype and \
                    self.output_dtype(replace(case, output_dtype=convention), name) == got:
                return f" ({got} is {means}: declare --output-dtype {convention})"
        return ""

    def output_shape(self, case, name: str, x_shape: tuple[int, ...]) -> tuple[int, ...]:
        """y and dx are shaped like x (one rank's rows of it in a world); statistics have one value
        per set; running statistics one per channel; the parameters' gradients are shaped like them."""
        declared = self._declared(name)
        if declared is not None:
            return self.shape_of(case, declared.shape, x_shape)
        if name in self.x_shaped:
            return tuple(x_shape)
        if name in self.saved_stats:
            return self.view(case).stats_shape
        if name.startswith("running_"):
            return (case.channels,)
        if self.layout is not None and self.layout.params == SHARDED:
            return (x_shape[-1],)  # a rank's slice of γ along the hidden dim it holds
        return self.view(case).param_shape

    def contract(self, kind: str) -> tuple[str, Callable | None]:
        """(signature, call) of the op's `--impl` contract of a framework kind: "torch" (tensors, autograd),
        "array" (JAX, TensorFlow: pure functions of arrays) or "direct" (NumPy: every output computed by the function,
        which the adapter calls itself)."""
        if kind == "torch":
            return self.signature, self.call
        if kind == "direct":
            return DIRECT_SIGNATURE, None
        if self.array_signature is None:
            raise UsageError(f"{self.name} has no array contract yet: its implementations are torch functions")
        return self.array_signature, self.array_call

    @property
    def x_shaped(self) -> tuple[str, ...]:
        """The outputs shaped like x: y, dx, the second-order ones, and the declared results and gradients."""
        return X_SHAPED + tuple(r.name for r in self.results if r.shape == "x") + tuple(
            o.gradient for o in self.operands if o.gradient and o.shape == "x")

    @property
    def all_outputs(self) -> tuple[str, ...]:
        """Every output a case of the op may compare: `outputs`, and the second-order ones where it has them."""
        return self.outputs + (SECOND_ORDER_OUTPUTS + tuple(TANGENT_OUTPUTS) if self.double_backward else ())

    @property
    def known_issues(self) -> tuple[KnownIssue, ...]:
        """Every known issue of torch's implementations of this op."""
        return tuple(dict.fromkeys(k for i in self.impls for k in i.known_issues))

    def units(self, case) -> int:
        """How many channels or groups a tensor's ratios break down into."""
        return self.view(case).blocks
