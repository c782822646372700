"""Run an implementation on torch tensors: forward, backward through autograd, interface checks,
outputs back as float64 NumPy. The one place these rules live, for one process and for every rank
of a world alike.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import replace
from functools import partial

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd.function import once_differentiable
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ...core.errors import ImplError, NotDifferentiable
from ...core.text import called_at, exception_text
from .tensors import TORCH_DTYPES, TorchInputs, dtype_name, torch_inputs, with_threads
from .triton import no_driver

Outputs = dict[str, "torch.Tensor | None"]


def check_tensor(name: str, value, shape: tuple[int, ...], dtype: torch.dtype | None, note=None) -> torch.Tensor:
    """`value` is a tensor of `shape` (and `dtype`, unless None), else ImplError; `note(got)`: what to add to a
    wrong dtype's message (Op.dtype_note)."""
    if not isinstance(value, torch.Tensor):
        raise ImplError(f"{name} is {type(value).__name__}, expected a tensor")
    if tuple(value.shape) != tuple(shape):
        raise ImplError(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        got = dtype_name(value.dtype)
        raise ImplError(f"{name} has dtype {got}, expected {dtype_name(dtype)}{note(got) if note else ''}")
    return value


def grad_leaves(t: TorchInputs, case, gradients: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """The inputs the case differentiates with respect to (Case.grads, or the named `gradients`) made to require
    grad, keyed by the name of their gradient; a frozen one stays as it is."""
    named = {"x": t.x, "weight": t.weight, "bias": t.bias, **t.extra}
    wrt = case.record.gradients
    return {k: named[wrt[k]].requires_grad_() for k in (case.grads if gradients is None else gradients)}


def differentiate(op, fn, case, t: TorchInputs, group=None, world_size: int = 1) -> Outputs:
    """y = fn(...) under the op's contract, then every gradient the case asks for through autograd with dy
    (and, at order 2, the gradients of ⟨ddx, dx⟩ + ⟨ddγ, dγ⟩ + ⟨ddβ, dβ⟩ with respect to x, γ and dy); in forward
    mode the same run with x, γ and β dual tensors (forward_mode).

    A gradient may be None only on a rank that holds no rows (it then counts as zero); anywhere
    else None means no gradient reaches that input.
    """
    if case.forward_mode:
        with fwAD.dual_level():
            out = forward_mode(op, fn, case, t, group, world_size)
    else:
        out = reverse_mode(op, fn, case, t, group, world_size)
    if op.tracks(case):  # updated in place by the implementation
        out["running_mean"], out["running_var"] = t.running_mean, t.running_var
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def reverse_mode(op, fn, case, t: TorchInputs, group=None, world_size: int = 1) -> Outputs:
    """The outputs and gradients (differentiate), not yet detached: forward mode takes their tangents."""
    leaves = grad_leaves(t, case)
    second = case.order == 2
    dy = t.dy.detach().requires_grad_() if second else t.dy
    returned = called(op, fn, case, t, group, world_size)
    if not returned["y"].requires_grad:
        raise ImplError("y does not require grad: the implementation detached its output")
    # y with dy, and each declared result with its cotangent (add + norm's h with dh) where it requires grad: a
    # result that depends on no input asked about (h, with x frozen) has no gradient to give; one detached while
    # they require grad drops its cotangent from their gradients, which the comparison shows
    differentiated = [("y", dy)] + [(r.name, t.extra[r.cotangent]) for r in op.results_of(case)
                                    if r.cotangent and returned[r.name].requires_grad]
    # Every rank runs backward, empty ones included: they must still join the collectives.
    grads = torch.autograd.grad([returned[name] for name, _ in differentiated], list(leaves.values()),
                                grad_outputs=[cot for _, cot in differentiated], allow_unused=True,
                                create_graph=case.backward_differentiated)
    out: Outputs = dict(returned)
    for name, grad in zip(leaves, grads):
        if grad is None and t.x.numel():
            raise ImplError(f"{name} is None: no gradient reaches that input")
        out[name] = grad
    if "dx" in out and out["dx"] is None:
        out["dx"] = torch.zeros_like(t.x)
    if second:
        out.update(double_backward(case, t, leaves, grads, dy))
    return out


def called(op, fn, case, t: TorchInputs, group, world_size: int) -> dict[str, torch.Tensor]:
    """fn's results under the op's contract, checked for shape, dtype and device, x handed to it as a network hands it
    (`handed`). A layer given by its class (frameworks.torch.layers.Layer) learns the case's own facts first
    (`for_case`)."""
    fn = fn.for_case(case) if hasattr(fn, "for_case") else fn
    returned = results(op, case, op.call(fn, handed(t), case, group, world_size), t.x.shape)
    for name, value in returned.items():
        if value.device != t.x.device:
            raise ImplError(f"{name} is on {value.device}, expected {t.x.device} (x's device)")
    return returned


def handed(t: TorchInputs) -> TorchInputs:
    """t with x as a network hands it to a layer: no leaf (a convolution's output, say), in memory the layer may
    overwrite (InPlaceABN; a forward that writes x.sub_(mean), F.relu(x, inplace=True)), in the case's exact layout
    (TorchInputs.x_handed). The case's x stays the leaf the gradients are taken of, which no implementation reaches:
    dx, order 2's d2x and the check of x's bits after the run read the values the case made."""
    return t if t.x_handed is None else replace(t, x=_Handed.apply(t.x, (t.x_handed,)))


class _Handed(torch.autograd.Function):
    """x_handed, holding x's values since the inputs were made, linked to x by autograd as the identity: the gradient
    that reaches it is x's, in reverse mode, forward mode and the double backward alike. (Not x_handed.copy_(x), which
    autograd records too: that copy would be a write into x_handed while the guard watches it, and the guard tells the
    layer's own writes there by the memory they land in.)"""

    @staticmethod
    def forward(ctx, x, into):
        return into[0]  # (passed in a tuple: a tensor argument returned as it is would come back as a view of itself,
        # which autograd then refuses to let the layer write)

    @staticmethod
    def backward(ctx, grad):
        return grad, None

    @staticmethod
    def jvp(ctx, tangent, _):
        return tangent


def forward_mode(op, fn, case, t: TorchInputs, group=None, world_size: int = 1) -> Outputs:
    """Forward-mode AD (inside a dual level): x, γ and β that require grad made dual tensors with the case's
    tangents (its directions ddx, ddweight, ddbias); order fwd runs the forward alone and takes y's tangent; fwd-rev
    also runs the backward through autograd and takes the gradients' tangents (forward-over-reverse)."""
    tangents = {"dx": t.ddx, "dweight": t.ddweight, "dbias": t.ddbias}
    wrt = op.gradients
    # x, γ, β require grad before they are made dual: fwd-rev's gradients are of the duals; and in both orders a
    # torch.library custom op takes its autograd path (which says it has no jvp) only where an input requires grad,
    # elsewhere it drops the tangents silently
    grad_leaves(t, case, case.differentiated)
    dual = replace(t, **{wrt[g]: fwAD.make_dual(getattr(t, wrt[g]), tangents[g]) for g in case.differentiated})
    try:
        out = called(op, fn, case, dual, group, world_size) if case.order == "fwd" else reverse_mode(
            op, fn, case, dual, group, world_size)
    except (NotImplementedError, RuntimeError) as e:
        if _NO_FORWARD.search(str(e)):
            raise NotDifferentiable(f"no forward-mode derivative: {exception_text(e)}",
                                    declines={"order": ("fwd", "fwd-rev")}) from None
        raise
    for name, primal in case.tangents.items():
        tangent = fwAD.unpack_dual(out[primal]).tangent
        if tangent is None and primal == "y":
            raise ImplError("y carries no tangent: the implementation computed it outside forward-mode AD "
                            "(a detached or copied result)")
        if tangent is None:
            tangent = missing_tangent(out, primal)
        out[name] = tangent
    return out


def missing_tangent(out: Outputs, primal: str) -> torch.Tensor:
    """The tangent of a gradient that carries none: its backward was computed outside forward-mode AD's reach (from
    saved values, say). Taken as 0, so the comparison shows what that misses, as order 2 shows a backward not
    differentiable through the statistics; a SKIP only where the implementation declares it (a backward marked
    @once_differentiable)."""
    once = once_differentiable_function(out["y"])
    if once:
        raise NotDifferentiable(f"no forward-mode derivative of its backward: {primal} carries no tangent, and "
                                f"{once}'s backward is marked @once_differentiable", declines={"order": (2, "fwd-rev")})
    return torch.zeros_like(out[primal])


def once_differentiable_function(y: torch.Tensor) -> str:
    """The name of a custom autograd.Function behind y whose backward is marked @once_differentiable, or ''."""
    nodes, seen = [y.grad_fn], set()
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        function = getattr(node, "_forward_cls", None)  # (the Function class of a custom Function's node)
        if getattr(getattr(function, "backward", None), "__code__", None) is _ONCE_DIFFERENTIABLE_CODE:
            return function.__name__
        nodes.extend(n for n, _ in node.next_functions)
    return ""


# The code of every backward torch's @once_differentiable wraps (functools.wraps keeps the name, not the code)
_ONCE_DIFFERENTIABLE_CODE = once_differentiable(lambda ctx: None).__code__


# What torch says when forward-mode AD meets code without a forward-mode formula (a custom Function without jvp,
# an op whose forward derivative is not implemented)
_NO_FORWARD = re.compile(r"implement the jvp function|forward AD .*not (been )?implemented|not implemented .*forward"
                         r"|does not support forward", re.I)


def results(op, case, returned, x_shape) -> dict[str, torch.Tensor]:
    """y, or (y, *results) for a case of an op that declares results (Op.results_of), checked for shape and dtype,
    by name."""
    names = ("y",) + tuple(r.name for r in op.results_of(case))
    if len(names) > 1 and not (isinstance(returned, (tuple, list)) and len(returned) == len(names)):
        got = f"{len(returned)} values" if isinstance(returned, (tuple, list)) else type(returned).__name__
        raise ImplError(f"returned {got}, expected ({', '.join(names)})")
    values = returned if len(names) > 1 else (returned,)
    return {name: check_tensor(name, v, op.output_shape(case, name, x_shape), TORCH_DTYPES[op.output_dtype(case, name)],
                               partial(op.dtype_note, case, name)) for name, v in zip(names, values)}


def double_backward(case, t: TorchInputs, leaves: dict[str, torch.Tensor], grads, dy: torch.Tensor) -> Outputs:
    """d2x, d2weight and d2dy: autograd through the first-order gradients, with the case's cotangents."""
    cotangents = {"dx": t.ddx, "dweight": t.ddweight, "dbias": t.ddbias}
    if not all(g is not None and g.requires_grad for g in grads):
        raise NotDifferentiable("only once differentiable: its first-order gradients do not require grad "
                                "under create_graph (a detached backward)", declines=_TWICE_DECLINED)
    refusing = {type(g.grad_fn).__name__ for g in grads} & _REFUSING_NODES
    if refusing:  # (differentiating through them raises, or silently reaches nothing: dy is not behind them)
        raise NotDifferentiable(f"only once differentiable: its first-order gradients come from autograd's "
                                f"{' and '.join(sorted(refusing))} node (a once_differentiable backward, or an op "
                                f"without a derivative)", declines=_TWICE_DECLINED)
    wanted = {"d2x": t.x, "d2weight": t.weight, "d2dy": dy}
    wrt = {name: wanted[name] for name in case.directional}
    try:
        second = torch.autograd.grad(list(grads), list(wrt.values()), grad_outputs=[cotangents[k] for k in leaves],
                                     allow_unused=True)
    except RuntimeError as e:
        if _NOT_TWICE.search(str(e)):
            raise NotDifferentiable(f"only once differentiable: {exception_text(e)}", declines=_TWICE_DECLINED) from None
        raise
    return {name: torch.zeros_like(v) if g is None else g for (name, v), g in zip(wrt.items(), second)}


# What a backward that cannot be differentiated again declines: order 2 (forward-over-reverse may still run: the
# forward-mode derivatives of the backward are formulas of their own, probed apart)
_TWICE_DECLINED = {"order": (2,)}
# The nodes autograd puts behind a gradient it cannot differentiate again (once_differentiable's DelayedError,
# an op whose derivative is not implemented)
_REFUSING_NODES = {"Error", "DelayedError", "NotImplemented"}
# What torch says when a backward has no derivative of its own (a once_differentiable Function, an op
# without a double-backward formula, a compiled backward)
_NOT_TWICE = re.compile(r"once_differentiable|not implemented|does not require grad|is not differentiable twice"
                        r"|derivative for .* is not implemented"
                        r"|does not currently support double backward"  # (torch.compile's AOTAutograd)
                        r"|no autograd formula was registered", re.I)  # (a custom op its backward calls: torch.library)


def to_numpy(op, case, outputs: Outputs, x_shape: tuple[int, ...], dtypes: bool = True) -> dict[str, np.ndarray]:
    """The outputs the op defines, checked against their expected shapes and dtypes (`dtypes`: False for a witness,
    Bound.values_only), as float64.

    Saved statistics may legitimately come back in another float dtype; nothing else may.
    `running_mean[rank 2]` is checked like `running_mean`.
    """
    out = {}
    for name, value in outputs.items():
        base = name.split("[")[0]
        if value is None or base not in op.outputs_of(case) or (base in op.saved_stats and not case.training):
            continue  # (eval mode saves no statistics of the batch)
        dtype = None if base in op.saved_stats or not dtypes else TORCH_DTYPES[op.output_dtype(case, base)]
        value = check_tensor(name, value, op.output_shape(case, base, x_shape), dtype, partial(op.dtype_note, case, base))
        out[name] = value.detach().to(torch.float64).cpu().contiguous().numpy()
    return out


class OpRecorder(TorchDispatchMode):
    """Records the aten ops a run dispatches ("aten.native_group_norm", ...): known issues of torch's
    kernels follow those kernels into any implementation that calls them."""

    # A file descriptor each op's name is written to when the run first dispatches it, before its kernel runs (None:
    # none): a worker process sets it (worlds.workers), so the kernels a run called are known when one of them kills
    # the process (a segfault in torch's kernel is torch's known issue in any code that called it)
    journal: int | None = None

    def __init__(self):
        super().__init__()
        self.packets: set = set()  # (named once at the end: a composed implementation dispatches thousands of ops)

    @property
    def ops(self) -> frozenset[str]:
        return frozenset(str(packet) for packet in self.packets)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet not in self.packets:
            self.packets.add(packet)
            if OpRecorder.journal is not None:
                os.write(OpRecorder.journal, f"{packet}\n".encode())
        return func(*args, **(kwargs or {}))


def compiled(fn) -> bool:
    """`fn` is what torch.compile returned (a function or a module): under a dispatch mode it would silently run
    eagerly, so no aten ops are watched for it (Impl.dispatch_mode says the same of code that calls compiled code)."""
    if "torch._dynamo" not in sys.modules:  # (nothing was compiled; and asking would import dynamo, ~1 s)
        return False
    return hasattr(fn, "_torchdynamo_orig_callable") or isinstance(fn, torch._dynamo.eval_frame.OptimizedModule)


class InPlaceGuard(TorchFunctionMode):
    """Names a write into an input the implementation must leave as it is (γ, β, dy; x where it is handed the case's
    own, the direct convention: TorchInputs.guarded) where the implementation's own code makes it: otherwise torch
    says it later and vaguely (a leaf used in an in-place operation, a version counter that moved), or not at all when
    the values happen to stay the same. A write from inside a custom Function's forward or backward (code torch runs,
    not the caller) is left to the check of the values afterwards. A write into an input handed over (x:
    TorchInputs.handed) is the layer's to make where it returns y there, which only the end of the run tells: its first
    is noted (`writes`) for _overwritten."""

    def __init__(self, guarded: dict[str, torch.Tensor], handed: dict[str, torch.Tensor] | None = None):
        super().__init__()
        self.storages = {where: name for name, v in guarded.items() if (where := _storage(v))}
        self.handed = {where: name for name, v in (handed or {}).items() if (where := _storage(v))}
        self.writes: dict[str, str] = {}  # a handed input -> how and where it was first written ("mul_ at f.py:3 in g")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        written = kwargs.get("out") if "out" in kwargs else args[0] if args and _writes_self(name) else None
        for tensor in written if isinstance(written, (tuple, list)) else (written,):
            where = _storage(tensor) if isinstance(tensor, torch.Tensor) else 0
            if where in self.storages:
                raise ImplError(f"writes its input {self.storages[where]} in place ({_write(name, kwargs)})")
            if where in self.handed and self.handed[where] not in self.writes:
                self.writes[self.handed[where]] = _write(name, kwargs)
        return func(*args, **kwargs)


def _write(name: str, kwargs: dict) -> str:
    """'mul_ at test.py:12 in forward': the write a hook of normcheck's is handling, and where the code under test made
    it."""
    where = called_at()
    return f"{name}{'(out=...)' if 'out' in kwargs else ''}{' at ' + where if where else ''}"


# Methods whose trailing underscore changes a tensor's flags, not its values
_FLAG_SETTERS = {"requires_grad_", "share_memory_", "rename_", "retain_grad"}
_INPLACE_OPERATORS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                      "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}


def _writes_self(name: str) -> bool:
    return name in _INPLACE_OPERATORS or (name.endswith("_") and not name.endswith("__") and name not in _FLAG_SETTERS)


def _storage(tensor: torch.Tensor | None) -> int:
    """Where a tensor's elements live (a view, `.data` and a detached alias share it); 0 for no elements (or none)."""
    if not isinstance(tensor, torch.Tensor):
        return 0
    try:
        return tensor.untyped_storage().data_ptr() if tensor.numel() else 0
    except (RuntimeError, NotImplementedError):  # (a tensor subclass or meta tensor without storage)
        return 0


def _guarded_run(t: TorchInputs, produce, watch: bool = True) -> Outputs:
    before = t.snapshot()
    guard = InPlaceGuard(t.guarded(), t.handed())
    with guard if watch else contextlib.nullcontext():
        outputs = produce()
    if not isinstance(outputs, dict):
        raise ImplError(f"runner returned {type(outputs).__name__}, expected a dict of outputs")
    modified = t.modified_since(before)
    if modified:
        raise ImplError(f"modified its input {', '.join(modified)} in place")
    overwritten = _overwritten(t, outputs, guard.writes)
    if overwritten:
        raise ImplError(overwritten)
    return outputs


def _overwritten(t: TorchInputs, outputs: Outputs, writes: dict[str, str]) -> str | None:
    """What is wrong with the run's writes into the x it was handed, or None. A layer in place returns y in x's memory
    (InPlaceABN; x.sub_(mean).div_(std)): its caller handed it x to overwrite and reads y there. One that writes x and
    returns y elsewhere has changed its caller's tensor for nothing it returns (a residual stream read afterwards finds
    it changed): named as a write into any other input is (`writes`: the first the guard saw, where it saw it)."""
    if t.x_handed is None or _storage(outputs.get("y")) == _storage(t.x_handed):
        return None
    if "x" in writes:
        return f"writes its input x in place ({writes['x']})"
    return "modified its input x in place" if "x" in t.overwritten() else None


def records_ops(case) -> bool:
    """Whether a run of `case` watches the aten ops it dispatches. Not in forward mode: under a dispatch mode torch's
    norms' forward-AD formulas return other last bits in every dtype, and y's tangent in float32 for f16/bf16 y with
    float32 parameters (in y's dtype without one, as its callers get it), so watching would change what is judged; a
    forward-mode row that fails learns its kernels from a run of its first order instead (engine.compare)."""
    return not case.forward_mode


def run(op, bound, case, inputs) -> tuple[dict[str, np.ndarray], str, frozenset[str]]:
    """One process: the bound record's target under its convention ("contract": the op's --impl contract through
    autograd; "direct": target(case, tensors) returns every output itself). Returns the outputs, the
    path the implementation reports, and the aten ops it ran. The case's tensors live on bound.device (the run's
    --device), in the case's exact strides and storage offsets."""
    impl, direct = bound.impl, bound.impl.convention == "direct"
    # (a direct record reads the case's own x: a copy to hand over would go unused)
    device = None if bound.device == "cpu" else torch.device(bound.device)
    t = torch_inputs(inputs, device=device, hand_over_x=not direct)
    fn = impl.callable()
    call = (fn, case, t) if direct else (differentiate, op, fn, case, t)
    recorder, watch = OpRecorder(), impl.dispatch_mode and not compiled(fn)  # (modes would change compiled code)
    try:
        with recorder if watch and records_ops(case) else contextlib.nullcontext():
            outputs = _guarded_run(t, partial(with_threads, impl.threads, *call), watch)
        found = to_numpy(op, case, outputs, tuple(t.x.shape), dtypes=not bound.values_only)
    except BaseException as e:  # the kernels it ran before it raised (or before an output was refused): a known issue
        # of theirs may explain it
        e.ops_called = recorder.ops
        launched = no_driver(e)  # (Triton's own message names no kernel and no remedy)
        if launched:
            error = ImplError(launched)
            error.ops_called = e.ops_called
            raise error from e
        raise
    return found, impl.reported_path(case), recorder.ops


def run_rank(op, fn, case, inputs, rank: int, group, world_size: int,
             device: torch.device | None = None) -> dict[str, np.ndarray]:
    """One rank of a world: `fn` (the op's distributed contract) on this rank's share of x and dy
    and its share of γ and β (all of them where they are replicated), and the running statistics (on
    `device` when given); Case.rank_shard says which under the op's layout."""
    t = torch_inputs(inputs, case.rank_shard(rank), device)
    outputs = _guarded_run(t, lambda: differentiate(op, fn, case, t, group, world_size))
    return to_numpy(op, case, outputs, tuple(t.x.shape))
