"""Case: one fully specified problem, and the inputs it deterministically makes.

A Case is frozen and hashable; the same Case always makes bit-identical inputs. Inputs are made
once as a float64 master copy, quantised to the case's dtypes; the reference sees those quantised
values upcast to float64, the implementation sees them in the case's dtypes and memory formats.
What depends on the op (its normalisation sets, its own fields such as groups, whether the batch
is split over ranks) comes from the op's record.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from math import prod

import numpy as np

from ..core.errors import UsageError
from ..core.machine import available_memory, gib
from ..core.text import listing
from ..numerics.dtypes import COMPUTE_DTYPES, DTYPES, OUTPUT_DTYPES, DtypeSpec, quantise
from ..numerics.formats import check_format
from ..numerics.profiles import PROFILES
from ..numerics.sets import SetView
from ..ops import CASE_FIELDS, GRADIENTS, OPS, Op, distributed_ops, get_op
from ..ops.core import ALL_ORDERS, FORWARD_ORDERS, TANGENT_OUTPUTS


def default_conventions(op: str) -> dict:
    """The conventions `op`'s cases follow unless an implementation declares others (torch's)."""
    fields = {f.name: f.default for f in dataclass_fields(Case) if f.name in CONVENTIONS}
    fields.update(dict.fromkeys(OP_CONVENTIONS))
    return {name: get_op(op).case_fields.get(name, default) for name, default in fields.items()
            if name not in OP_CONVENTIONS or name in get_op(op).case_fields}
AFFINE_CHOICES = ("both", "none")  # with the op's parameter names, what --affine takes
DEFAULT_EPS, DEFAULT_MOMENTUM = 1e-5, 0.1  # what a label leaves unsaid
# The path through the layer a case takes, beyond the training-mode forward and one backward:
MODES = ("train", "eval")          # eval: normalise with the running statistics, leave them unchanged
FROZEN = ("none", "x", "params")   # which inputs do not require grad (their gradients are not asked for)
# 1: the backward. 2: also the gradient of ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩ (double backward). Forward mode (no
# backward): "fwd", the JVP of y along tangents ẋ, γ̇, β̇ of the inputs that require grad; "fwd-rev", the backward
# and the JVP of y and of the gradients along those tangents (forward-over-reverse: Hessian-vector products).
ORDERS = ALL_ORDERS


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: str = "f32"            # x, dy, y, dx
    param_dtype: str | None = None  # γ, β, running stats; None: same as dtype
    x_format: str = "contiguous"
    dy_format: str | None = None  # None: same as x_format
    profile: str = "normal"
    eps: float | None = DEFAULT_EPS  # None: the op's default for the input dtype (Op.eps_none), if it has one
    momentum: float = DEFAULT_MOMENTUM
    affine: bool | str = True     # True: every parameter the op takes; False: none; "weight" / "bias": that one only
    seed: int = 0
    split: tuple[int, ...] | None = None  # per-rank shares of the op's split axis (Op.layout); None: one process
    gamma_scale: float = 1.0      # multiplies γ: recipes that divide by γ fail as it shrinks
    mode: str = "train"           # MODES
    frozen: str = "none"          # FROZEN
    order: int | str = 1          # ORDERS
    output_dtype: str = "input"   # OUTPUT_DTYPES: y in x's dtype, or promoted with what the layer uses (Op.promotes_through)
    compute_dtype: str = "f64"    # COMPUTE_DTYPES: the finest precision the kernel computes in (f32: float64 too)
    # The fields only some ops take (ops.CaseField, declared by their records: GroupNorm's groups, RMSNorm's casting
    # chain, ...), as (name, value) pairs in OP_FIELDS' order, the absent ones left out. Given and read by name as
    # any other field (Case(op, shape, groups=2), case.groups: None where absent), so a new op's field needs no line
    # here.
    own: tuple[tuple[str, object], ...] = ()

    def __init__(self, *args, **given):
        if len(args) > len(COMMON_FIELDS):
            raise TypeError(f"Case() takes at most {len(COMMON_FIELDS)} positional arguments")
        given.update(zip(COMMON_FIELDS, args))  # (a value given both ways is the positional one, as no caller does)
        own = dict(given.pop("own", ()))
        own.update({name: given.pop(name) for name in list(given) if name in CASE_FIELDS})
        if unknown := sorted(set(given) - set(COMMON_FIELDS)):
            raise TypeError(f"Case() got an unexpected keyword argument {unknown[0]!r}")
        for f in dataclass_fields(Case):
            object.__setattr__(self, f.name, given[f.name] if f.name in given else f.default)
        object.__setattr__(self, "own", tuple(own.items()))
        self.__post_init__()

    def __getattr__(self, name: str):
        """An op's own field by name: its value, None where the case does not have it."""
        if name in CASE_FIELDS and "own" in self.__dict__:  # (not while unpickling, before the fields are set)
            return dict(self.own).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.param_dtype is None:
            object.__setattr__(self, "param_dtype", self.dtype)
        if self.dy_format is None:
            object.__setattr__(self, "dy_format", self.x_format)
        own = dict(self.own)
        for name in DEFAULTED:
            if own.get(name) is None and self.op in OPS and name in OPS[self.op].case_fields:
                own[name] = OPS[self.op].case_fields[name]
        object.__setattr__(self, "own", tuple((name, own[name]) for name in OP_FIELDS if own.get(name) is not None))
        if not self.affine and self.op in OPS and not OPS[self.op].tracks(self):
            # No parameter tensor at all: nothing is in the parameter dtype, so "mixed" means nothing
            # (torch keeps such a case's saved statistics in the input dtype, as for a plain one).
            object.__setattr__(self, "param_dtype", self.dtype)
        if self.split is not None:
            object.__setattr__(self, "split", tuple(int(s) for s in self.split))
        elif self.op in OPS and OPS[self.op].distributed and self.shape:
            object.__setattr__(self, "split", (OPS[self.op].layout.extent(self.shape),))  # one rank holds it all
        self.validate()

    # -- validation: every message is one line a person can act on -------------------------
    def validate(self) -> None:
        op = get_op(self.op)
        if not 2 <= len(self.shape) <= 5:
            raise UsageError(f"shape {self._shape_text} must be (N, C) plus 0 to 3 spatial dims")
        if len(self.shape) not in op.ranks:
            raise UsageError(f"{self.op} takes {', '.join(f'{r}-D' for r in op.ranks)} input, not the "
                             f"{len(self.shape)}-D shape {self._shape_text}")
        if any(s < 0 for s in self.shape) or self.shape[1] < 1:
            raise UsageError(f"shape {self._shape_text} has a negative size or no channels")
        if 0 in self.shape:  # (an empty rank of a distributed op is a 0 in its split, judged: its case has elements)
            raise UsageError(f"shape {self._shape_text} has no elements: an empty batch is not judged (a distributed "
                             "op's empty rank is a 0 in --split)")
        for name in (self.dtype, self.param_dtype):
            if name not in DTYPES:
                raise UsageError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise UsageError(f"unknown output dtype {self.output_dtype!r}; choose one of {', '.join(OUTPUT_DTYPES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise UsageError(f"unknown compute dtype {self.compute_dtype!r}; choose one of {', '.join(COMPUTE_DTYPES)}"
                             " (f32: the kernel computes in float32 at most, float64 input included)")
        if self.param_dtype != self.dtype and not (self.param_dtype == "f32" and self.dtype in ("f16", "bf16")):
            raise UsageError(
                f"parameter dtype {self.param_dtype} with input {self.dtype}: mixed precision means f16/bf16 input with f32 parameters"
            )
        check_format(self.x_format, len(self.shape))
        check_format(self.dy_format, len(self.shape), "dy")
        if self.profile not in PROFILES:
            raise UsageError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.eps is None and op.eps_none is None:
            raise UsageError(f"{self.op} needs a number for eps (eps=None is {self._eps_none_takers})")
        if self.eps is not None and not 0 <= self.eps < float("inf"):
            raise UsageError(f"eps must be a finite number >= 0, got {self.eps}")
        if self.eps == 0 and self.mode not in op.eps_zero:
            raise UsageError(f"{self.op} takes eps > 0 in {self.mode} mode (torch refuses eps = 0 where it normalises "
                             f"with the batch's variance); eps = 0 is legal in {' and '.join(op.eps_zero)} mode")
        if not 0 <= self.momentum <= 1:  # (NaN fails this too)
            raise UsageError(f"momentum must be a number from 0 to 1, got {self.momentum}")
        if self.affine not in (True, False) and self.affine not in op.params:
            raise UsageError(f"--affine {self.affine}: {self.op} takes {' and '.join(op.params)} "
                             f"(choose {', '.join(AFFINE_CHOICES[:1] + op.params + AFFINE_CHOICES[1:])})")
        self._validate_path(op)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UsageError(f"seed must be an integer >= 0, got {self.seed!r}")
        for name in OP_FIELDS:
            if getattr(self, name) is not None and name not in op.case_fields:
                raise UsageError(f"--{CASE_FIELDS[name].option} applies to {listing(takers_of(name))} only, not {self.op}")
            CASE_FIELDS[name].check(getattr(self, name))
        op.validate(self)
        if self.view.set_size < op.min_set_size:
            raise UsageError(f"shape {self._shape_text} gives {self.view.set_size} values per {op.unit}; "
                             f"{self.op} needs at least {op.min_set_size}")
        if self.split is not None:
            if not op.distributed:
                raise UsageError(f"a split applies to {listing(distributed_ops())} only, not {self.op}")
            if not self.split:
                raise UsageError("split must name at least one rank")
            if any(s < 0 for s in self.split):
                raise UsageError(f"split {self.split} has a negative size")
            extent = op.layout.extent(self.shape)
            if sum(self.split) != extent:
                raise UsageError(f"split {self.split} sums to {sum(self.split)}, not {op.layout.extent_text(self.shape)}")

    def _validate_path(self, op: Op) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.mode == "eval" and not op.running_stats:
            takers = [o.name for o in OPS.values() if o.running_stats]
            raise UsageError(f"--mode eval applies to the ops with running statistics ({', '.join(takers)}), not {self.op}")
        if self.mode == "eval" and self.running_stats == "none":
            raise UsageError("--mode eval normalises with the running statistics: a layer that keeps none "
                             "(--running-stats none) normalises with the batch's in every mode")
        if self.frozen not in FROZEN:
            raise UsageError(f"unknown frozen {self.frozen!r}; choose one of {', '.join(FROZEN)}")
        if self.frozen == "params" and not self.affine:
            raise UsageError("--frozen params: the case has no parameters to freeze (it has --affine none)")
        if self.frozen == "x" and not self.affine:
            raise UsageError("--frozen x with --affine none leaves nothing that requires grad")
        if isinstance(self.order, bool) or self.order not in ORDERS:
            raise UsageError(f"order must be 1, 2, fwd or fwd-rev, got {self.order!r}")

    @property
    def _eps_none_takers(self) -> str:
        takers = [o.name for o in OPS.values() if o.eps_none is not None]
        return f"for {listing(takers)} only" if takers else "for no op"

    @property
    def has_weight(self) -> bool:
        return self.affine is True or self.affine == "weight"

    @property
    def has_bias(self) -> bool:
        return (self.affine is True or self.affine == "bias") and "bias" in self.record.params

    @property
    def training(self) -> bool:
        """The layer normalises with the batch's statistics (and updates the running ones)."""
        return self.mode == "train"

    @property
    def differentiated(self) -> tuple[str, ...]:
        """The gradients of every input that exists and requires grad (an op's declared data inputs are frozen with
        x), by gradient name: what the backward gives, and (forward mode) the inputs that carry a tangent."""
        given = {"weight": self.has_weight and self.frozen != "params", "bias": self.has_bias and self.frozen != "params"}
        return tuple(g for g, wrt in self.record.gradients.items() if given.get(wrt, self.frozen != "x"))

    @property
    def grads(self) -> tuple[str, ...]:
        """The first-order gradients the case asks for: none in forward mode alone (order fwd runs no backward)."""
        return () if self.order == "fwd" else self.differentiated

    @property
    def directional(self) -> tuple[str, ...]:
        """The directional-derivative outputs the case compares that are not identically 0 (ops.DIRECTIONAL).

        Order 2, the gradients of ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩ over the gradients asked for: dy's, always;
        x's, where it requires grad and dγ is asked for or dx depends on x (training: the statistics are x's); γ's,
        where dx is asked for (only dx depends on γ); β's never (y is linear in it). Forward mode, along tangents t
        of the inputs that require grad: y's JVP (= d2dy, y is J·t); fwd-rev also the JVPs of dx and dγ, which are
        H·t, the same conditions as d2x and d2weight by the Hessian's symmetry (dβ = Σ dy has none)."""
        if self.order == 1:
            return ()
        if self.order == "fwd":
            return ("jvp_y",)
        wrt = set(self.differentiated)
        d2x = "dx" in wrt and ("dweight" in wrt or self.training)
        d2weight = {"dx", "dweight"} <= wrt
        if self.order == "fwd-rev":
            return ("jvp_y",) + ("jvp_dx",) * d2x + ("jvp_dweight",) * d2weight
        return ("d2x",) * d2x + ("d2weight",) * d2weight + ("d2dy",)

    @property
    def backward_differentiated(self) -> bool:
        """The backward runs under create_graph, to be differentiated again (order 2; fwd-rev, whose backward carries
        tangents): torch then runs its composite, differentiable backward formulas instead of the fused kernels."""
        return self.order in (2, "fwd-rev")

    @property
    def forward_mode(self) -> bool:
        """The case runs forward-mode AD (order fwd or fwd-rev)."""
        return self.order in FORWARD_ORDERS

    @property
    def tangents(self) -> dict[str, str]:
        """Forward mode: each JVP output the case compares -> the output it is the tangent of."""
        return {name: TANGENT_OUTPUTS[name] for name in self.directional if name in TANGENT_OUTPUTS}

    @property
    def eps_value(self) -> float:
        """The eps the layer adds: the case's, or what eps=None means for the precision the layer computes in (the
        input dtype's accumulation, no finer than compute_dtype)."""
        return self.record.eps_none(self.dtypes.accumulation) if self.eps is None else self.eps

    @property
    def _shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    # -- derived facts ----------------------------------------------------------------------
    @property
    def dtypes(self) -> DtypeSpec:
        return DtypeSpec(self.dtype, self.param_dtype, self.compute_dtype)

    @property
    def record(self) -> Op:
        """The op's record (normcheck.ops)."""
        return OPS[self.op]

    @property
    def view(self) -> SetView:
        return self.record.view(self)

    def rank_shard(self, rank: int) -> tuple[tuple, tuple]:
        """(index of `rank`'s share of x and dy, index of its share of γ and β) under `split` and the op's layout."""
        layout = self.record.layout
        return layout.data_index(self.split, rank), layout.param_index(self.split, rank)

    def rank_offset(self, rank: int) -> int:
        """`rank`'s first index along the split axis (its rows' or its hidden slice's start)."""
        return self.record.layout.start(self.split, rank)

    @property
    def channels(self) -> int:
        return self.shape[1]

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def label(self) -> str:
        fmt = self.x_format if self.dy_format == self.x_format else f"{self.x_format}:{self.dy_format}"
        parts = [self._shape_text, self.dtypes.label, fmt, self.profile]
        parts[1:1] = [s for name in OP_FIELDS if (s := CASE_FIELDS[name].shown(getattr(self, name))) is not None]
        if self.eps != DEFAULT_EPS:  # (None: the op's default for the dtype)
            parts.append(f"eps={self.eps:g}" if self.eps is not None else "eps=None")
        if self.momentum != DEFAULT_MOMENTUM and self.record.running_stats:
            parts.append(f"momentum={self.momentum:g}")
        if self.split is not None:
            parts.append("split=" + ",".join(map(str, self.split)))
        if not self.affine:
            parts.append("no-affine")
        elif self.affine is not True:
            parts.append(f"{self.affine}-only")
        if self.gamma_scale != 1.0:
            parts.append(f"gamma×{self.gamma_scale:g}")
        if self.mode != "train":
            parts.append(self.mode)
        if self.frozen != "none":
            parts.append(f"frozen-{self.frozen}")
        if self.order != 1:
            parts.append(f"order={self.order}")
        if self.output_dtype != "input":
            parts.append(f"out={self.output_dtype}")
        if self.compute_dtype != "f64":
            parts.append(f"compute={self.compute_dtype}")
        return " ".join(parts)

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)

    def make_inputs(self) -> "CaseInputs":
        return CaseInputs.make(self)


def _op_fields() -> tuple[str, ...]:
    """The declared op fields, in the order the records declare them; one named like a field every case has is
    refused here, when normcheck is imported, rather than shadowed by it."""
    if taken := sorted(set(CASE_FIELDS) & {f.name for f in dataclass_fields(Case)}):
        raise TypeError(f"case fields {', '.join(taken)} are declared by an op but every case has a field so named")
    return tuple(CASE_FIELDS)


# Fields only the ops that declare them take (ops.CaseField, listed by Op.fields, held in Case.own), in the order a
# label shows them; the conventions among them (how the layer is defined, not its geometry), and those a case that
# leaves None takes the op's default of
OP_FIELDS = _op_fields()
# Every field a case is given and read by: those every case has (in Case's order, its positional arguments), then
# the ops' own
COMMON_FIELDS = tuple(f.name for f in dataclass_fields(Case) if f.name != "own")
FIELD_NAMES = COMMON_FIELDS + OP_FIELDS
OP_CONVENTIONS = tuple(name for name in OP_FIELDS if CASE_FIELDS[name].convention)
DEFAULTED = tuple(name for name in OP_FIELDS if CASE_FIELDS[name].defaulted)
# The conventions every op takes: the dtype y comes back in, the finest precision the kernel computes in
CONVENTIONS = OP_CONVENTIONS + ("output_dtype", "compute_dtype")


def takers_of(name: str) -> list[str]:
    """The ops that take the case field `name`."""
    return [o.name for o in OPS.values() if name in o.case_fields]


@dataclass(frozen=True)
class CaseInputs:
    """Quantised float64 master copies of every input (canonical contiguous layout)."""

    case: Case
    x: np.ndarray
    dy: np.ndarray
    weight: np.ndarray | None
    bias: np.ndarray | None
    running_mean: np.ndarray | None  # (None: the case keeps no running statistics, Op.tracks)
    running_var: np.ndarray | None
    # The directions of the directional derivatives (shaped like x, γ and β; None for an input that does not require
    # grad): order 2, the cotangents of the first-order gradients; forward mode, the tangents of x, γ and β
    ddx: np.ndarray | None = None
    ddweight: np.ndarray | None = None
    ddbias: np.ndarray | None = None
    # The op's declared operands (Op.operands: a fused op's residual, its cotangent dh), by name
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def copied(self) -> "CaseInputs":
        """The same inputs in arrays of their own: for an implementation handed the master copies, which may write to
        them (the next run, or the next implementation judged on the case, reads the masters)."""
        return self.mapped(lambda a: a.copy())

    def mapped(self, fn, **changes) -> "CaseInputs":
        """These inputs with `fn` applied to every array (the declared operands' too), and `changes` (another case)."""
        arrays = {f.name: fn(getattr(self, f.name)) for f in dataclass_fields(self)
                  if isinstance(getattr(self, f.name), np.ndarray)}
        return replace(self, **arrays, extra={name: fn(a) for name, a in self.extra.items()}, **changes)

    def kept(self, outputs: dict) -> dict:
        """What a run on these inputs hands back: every output (a batch-invariance batch's keeps only what the check
        compares, engine.invariance)."""
        return outputs

    @classmethod
    def make(cls, case: Case) -> "CaseInputs":
        check_memory(case)
        rng = np.random.default_rng([case.seed, _stable_hash(case)])
        view = case.view
        x_sets, dy_sets = profile_values(case, case.dtype, rng)
        c, p = case.channels, view.param_shape
        # γ not all ones and β not all zeros, with both signs: a kernel that drops or swaps them shows.
        weight = rng.choice([-1.0, 1.0], size=p) * rng.uniform(0.5, 1.5, size=p) * case.gamma_scale
        bias = rng.uniform(-1, 1, size=p)
        running_mean = rng.normal(0, 0.1, size=c)
        running_var = rng.uniform(0.5, 1.5, size=c)
        q, qp = case.dtype, case.param_dtype
        if case.dy_format == "expanded":  # one sample's dy for the whole batch (stride 0 along it)
            dy_sets = view.to_sets(np.broadcast_to(view.from_sets(dy_sets)[:1], case.shape))
        # Directions from a stream of their own: x, dy, γ and β are the same at every order.
        cot = np.random.default_rng([case.seed, _stable_hash(case), 2])
        grads = set(case.differentiated) if case.order != 1 else set()
        ddx = quantise(cot.normal(size=case.shape), q) if "dx" in grads else None
        ddweight = quantise(cot.normal(size=p), qp) if "dweight" in grads else None
        ddbias = quantise(cot.normal(size=p), qp) if "dbias" in grads else None
        return _derived(cls(
            case=case,
            extra=_operands(case),
            x=quantise(view.from_sets(x_sets), q),
            dy=quantise(view.from_sets(dy_sets), q),
            weight=quantise(weight, qp) if case.has_weight else None,
            bias=quantise(bias, qp) if case.has_bias else None,
            running_mean=quantise(running_mean, qp) if case.running_stats != "none" else None,
            running_var=quantise(running_var, qp) if case.running_stats != "none" else None,
            ddx=ddx, ddweight=ddweight, ddbias=ddbias,
        ))


def profile_values(case: Case, dtype: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """x-like and dy-like values (sets, set size) from the case's profile, which aims its eps-sized data at the
    mean square where eps and the set's statistic are the same size (SetView.eps_as_mean_square), about the set's
    mean where the statistic is (StatisticForm.centres)."""
    view = case.view
    return PROFILES[case.profile](view.set_count, view.set_size, dtype, view.eps_as_mean_square(case.eps_value), rng,
                                  centred=view.form.centres(case.record.centred))


def _operands(case: Case) -> dict[str, np.ndarray]:
    """The op's declared operands, from a stream of their own (x, dy and the parameters stay as they were): an
    x-shaped data input drawn from the case's profile like x, a cotangent like dy (laid out as dy: expanded along
    the batch); one of another shape, or with a draw of its own, by its draw (standard normal by default)."""
    op, view = case.record, case.view
    rng = np.random.default_rng([case.seed, _stable_hash(case), 3])
    out = {}
    for operand in (o for o in op.operands_of(case) if o.derive is None):
        dtype = op.dtype_of(case, operand.dtype)
        if operand.draw is not None or operand.shape != "x":
            shape = op.shape_of(case, operand.shape, case.shape)
            draw = operand.draw or (lambda g, s: g.normal(size=s))
            out[operand.name] = quantise(draw(rng, shape), dtype)
            continue
        x_sets, dy_sets = profile_values(case, dtype, rng)
        values = view.from_sets(x_sets if operand.role == "input" else dy_sets)
        if operand.role == "cotangent" and case.dy_format == "expanded":
            values = np.broadcast_to(values[:1], case.shape)
        out[operand.name] = quantise(values, dtype)
    return out


def _derived(inputs: CaseInputs) -> CaseInputs:
    """The inputs with the declared operands made from the others (Operand.derive: fp8's scale, from y's range)."""
    case = inputs.case
    op = case.record
    derived = {o.name: quantise(o.derive(inputs), op.dtype_of(case, o.dtype)) for o in op.operands_of(case) if o.derive}
    return replace(inputs, extra={**inputs.extra, **derived}) if derived else inputs


# What judging a case holds at its peak, per element of x: float64 inputs, reference, bounds, baseline and the
# implementation's outputs (measured: a 4.2M-element order-2 BatchNorm case peaks at 530 bytes per element)
BYTES_PER_ELEMENT = 600


def check_memory(case: Case) -> None:
    """One line (UsageError) for a case this machine cannot hold, before anything is allocated."""
    need, have = case.numel * BYTES_PER_ELEMENT, available_memory()
    if have is not None and need > have:
        raise UsageError(f"shape {case._shape_text} has {case.numel:,} elements: judging it needs about {gib(need)} "
                         f"of memory, and this machine has {gib(have)} available")


def _stable_hash(case: Case) -> int:
    """A seed component from the fields that define the data, stable across processes (unlike hash()).

    Layouts, momentum, the world split and γ's scale are left out on purpose: the same seed gives
    the same values whether they are laid out channels-last, split over 3 ranks or scaled.
    """
    fields = (case.op, case.shape, case.dtype, case.param_dtype, case.profile, case.eps, case.affine, case.groups)
    if case.normalized_dims is not None:  # (kept out when absent: the other ops' inputs stay as they were)
        fields += (case.normalized_dims,)
    return zlib.crc32(repr(fields).encode())
