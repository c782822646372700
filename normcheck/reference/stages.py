"""The element-wise stages a fused norm applies around its inner norm, and their derivatives.

A fused op is an inner norm N (a record of its own, with its own reference) and stages: before it, on the value it
normalises; after it, on its output. With u a stage's input and v its output (x for the first stage before the
norm, N's output for the first after it), for L = <dy, y>:

    Sum         v = q(x + r + ...)       the sum is stored in its dtype (q), returned (h) and normalised; every
                                         summand's gradient is dv + dh (dh: the stored sum's own cotangent)
    Scale       v = u·f(m) [+ s]         a multiplier through an element-wise function f of an operand m (1 + m:
                                         adaLN's modulation; silu(m): a gate) and an optional shift s, each operand
                                         broadcast over u (per element, per sample, per sample and channel):
                                         du = dv·f(m),  dm = Σ dv·u·f'(m),  ds = Σ dv   (Σ: over the dims the
                                         operand is broadcast over)
    Activation  v = f(u)                 du = dv·f'(u)
    Cast        v = u                    a quantising cast beside the output (fp8 training recipes): u goes on
                                         unchanged (du = dv); q = round(sat(u·s)) in q's declared dtype (s: a
                                         scalar operand) and amax = max |u| are returned, not differentiated

Writing a new fusion is declaring its stages (ops.fused); the reference, the same-precision baseline and the
tolerance follow from them and the inner norm (engine.stage_bounds bounds each kind once).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, ClassVar

import numpy as np

from ._moments import as_working
from .silu import sigmoid, silu, silu_grad, silu_grad2

BEFORE, AFTER = "before", "after"


@dataclass(frozen=True)
class ElementFunction:
    """f with its first two derivatives (the tolerance propagates an argument's error through them) and how far an
    evaluation of f at an exact argument may land in unit roundoff u (`rounding(z, u, c)`, c: a few roundings)."""
    name: str
    f: Callable[[np.ndarray], np.ndarray]
    grad: Callable[[np.ndarray], np.ndarray]
    grad2: Callable[[np.ndarray], np.ndarray]
    rounding: Callable[[np.ndarray, float, float], np.ndarray]
    grad_rounding: Callable[[np.ndarray, float, float], np.ndarray]  # the same of f'
    # One IEEE operation (1 + m) rounds alike in every kernel of a precision; a transcendental (SiLU's exp) does not
    correctly_rounded: bool = False


def _silu_grad_terms(z: np.ndarray) -> np.ndarray:
    """|σ(z)| + |z·σ(z)·(1 − σ(z))|: the magnitudes SiLU's derivative sums (it cancels to 0 near z = −1.28)."""
    s = sigmoid(z)
    return s + np.abs(z * s * (1 - s))


# SiLU is several roundings (exp, add, divide, multiply): twice c of |f| (of its derivative's terms for f')
SILU = ElementFunction("silu", silu, silu_grad, silu_grad2, lambda z, u, c: 2 * c * u * np.abs(silu(z)),
                       lambda z, u, c: 2 * c * u * _silu_grad_terms(z))
# 1 + m rounds once, relative to its terms (|1 + m| itself may be near 0); its derivative is exactly 1
ONE_PLUS = ElementFunction("1 + m", lambda m: 1 + m, np.ones_like, np.zeros_like, lambda m, u, c: u * (1 + np.abs(m)),
                           lambda m, u, c: np.zeros_like(m), correctly_rounded=True)


@dataclass(frozen=True)
class Broadcast:
    """How an operand's dims sit among x's: its first `leading` dims are x's first ones and the rest x's last (None:
    all of them lead, as an x-shaped operand's or a per-(sample, channel) one's over the spatial dims); it is
    broadcast over the dims between, and its gradient sums over them."""
    leading: int | None = None
    name: str = "per element"

    def _lead(self, operand_ndim: int) -> int:
        return operand_ndim if self.leading is None else self.leading

    def expand(self, a, ndim: int) -> np.ndarray:
        """The operand as an array broadcastable against an x of `ndim` dims."""
        a = as_working(a)
        lead = self._lead(a.ndim)
        return a.reshape(a.shape[:lead] + (1,) * (ndim - a.ndim) + a.shape[lead:])

    def reduce(self, t: np.ndarray, operand_ndim: int) -> np.ndarray:
        """Σ of an x-shaped array over the dims the operand is broadcast over: its gradient's shape."""
        lead = self._lead(operand_ndim)
        axes = tuple(range(lead, lead + t.ndim - operand_ndim))
        return t.sum(axis=axes) if axes else t


PER_ELEMENT = Broadcast()
PER_SAMPLE = Broadcast(1, "per sample")  # (N, *D) over the sequence between: adaLN's
PER_CHANNEL = Broadcast(None, "per sample and channel")  # (N, C) over the spatial dims after: adaptive GroupNorm's


@dataclass(frozen=True)
class Sum:
    """v = q(x + the operands in `summands`), stored as the result `output` (q: its declared dtype), differentiated
    with the cotangent operand `cotangent` where the case returns it; each summand's gradient (`gradients`, x's
    first) is dv plus that cotangent."""
    summands: tuple[str, ...]
    output: str
    cotangent: str
    gradients: tuple[str, ...]
    side: ClassVar[str] = BEFORE
    kind: ClassVar[str] = "sum"
    backward_reads_input: ClassVar[bool] = False  # (du does not depend on u)
    adjacent: ClassVar[bool] = True  # (its bound reads the norm's input: it sits next to the norm)

    def operands(self) -> tuple[str, ...]:
        return self.summands[1:]

    def carries(self) -> dict[str, tuple[str, ...]]:
        """The inner norm's outputs -> the stage's outputs computed from them (a wrong one is wrong alike)."""
        return {"dx": self.gradients[1:]}

    def forward(self, u, operands: dict, store: Callable) -> tuple[np.ndarray, dict]:
        v = as_working(store(self.output, sum(as_working(operands[s]) for s in self.summands[1:]) + as_working(u)))
        return v, {self.output: v}

    def backward(self, dv, u, operands: dict) -> tuple[np.ndarray, dict]:
        cotangent = operands.get(self.cotangent)  # (None where the case's form does not return the sum)
        d = as_working(dv) if cotangent is None else as_working(dv) + as_working(cotangent)
        return d, {g: d for g in self.gradients[1:]}


@dataclass(frozen=True)
class Scale:
    """v = u·f(m) + s: the operand `multiplier` m through `fn`, an optional `shift` operand s, both laid over u as
    `broadcast` says; their gradients are named `gradients` (m's, then s's)."""
    multiplier: str
    fn: ElementFunction
    gradients: tuple[str, ...]
    shift: str | None = None
    broadcast: Broadcast = PER_ELEMENT
    side: str = AFTER
    kind: ClassVar[str] = "scale"
    backward_reads_input: ClassVar[bool] = False  # (du = dv·f(m))
    adjacent: ClassVar[bool] = False

    def operands(self) -> tuple[str, ...]:
        return (self.multiplier,) + ((self.shift,) if self.shift else ())

    def carries(self) -> dict[str, tuple[str, ...]]:
        """After the norm, dm is a sum of dy·ŷ·f'(m) (ŷ: the norm's y); before it, dm and ds are sums of the norm's
        gradient dv."""
        return {"y": self.gradients[:1]} if self.side == AFTER else {"dx": self.gradients}

    def factor(self, operands: dict, ndim: int) -> np.ndarray:
        """f(m) laid over an x of `ndim` dims."""
        return self.fn.f(self.broadcast.expand(operands[self.multiplier], ndim))

    def forward(self, u, operands: dict, store: Callable) -> tuple[np.ndarray, dict]:
        u = as_working(u)
        v = u * self.factor(operands, u.ndim)
        if self.shift is not None:
            v = v + self.broadcast.expand(operands[self.shift], u.ndim)
        return v, {}

    def backward(self, dv, u, operands: dict) -> tuple[np.ndarray, dict]:
        dv, u = as_working(dv), as_working(u)
        m = self.broadcast.expand(operands[self.multiplier], u.ndim)
        grads = {self.gradients[0]: self.broadcast.reduce(dv * u * self.fn.grad(m), np.ndim(operands[self.multiplier]))}
        if self.shift is not None:
            grads[self.gradients[1]] = self.broadcast.reduce(dv, np.ndim(operands[self.shift]))
        return dv * self.fn.f(m), grads


@dataclass(frozen=True)
class Activation:
    """v = f(u) after the norm."""
    fn: ElementFunction
    side: ClassVar[str] = AFTER
    kind: ClassVar[str] = "activation"
    backward_reads_input: ClassVar[bool] = True  # (du = dv·f'(u): the dy it hands inward depends on y)
    # (its bound reads the y bound of what it wraps and hands that a dy error, which a Scale after the norm takes on:
    # it may follow one, as diffusion blocks apply SiLU after the modulation)
    adjacent: ClassVar[bool] = False
    gradients: ClassVar[tuple] = ()

    def operands(self) -> tuple[str, ...]:
        return ()

    def carries(self) -> dict[str, tuple[str, ...]]:
        return {}

    def forward(self, u, operands: dict, store: Callable) -> tuple[np.ndarray, dict]:
        return self.fn.f(as_working(u)), {}

    def backward(self, dv, u, operands: dict) -> tuple[np.ndarray, dict]:
        return as_working(dv) * self.fn.grad(as_working(u)), {}


@dataclass(frozen=True)
class Cast:
    """A quantising cast after the norm: u goes on unchanged (the differentiated output), and the result `output` =
    u·s (s: the scalar operand `scale`) saturated to and rounded in that result's declared dtype is returned beside
    it, with `amax` = max |u| (what a recipe derives the next step's scale from); neither is differentiated. The
    product is formed in the working precision (a product with the power-of-two scales cases draw is exact)."""
    scale: str
    output: str
    amax: str
    side: ClassVar[str] = AFTER
    kind: ClassVar[str] = "cast"
    backward_reads_input: ClassVar[bool] = False  # (du = dv)
    adjacent: ClassVar[bool] = False
    gradients: ClassVar[tuple] = ()

    def operands(self) -> tuple[str, ...]:
        return (self.scale,)

    def carries(self) -> dict[str, tuple[str, ...]]:
        """Both results are computed from the y it receives: a wrong y is a wrong copy and amax."""
        return {"y": (self.output, self.amax)}

    def forward(self, u, operands: dict, store: Callable) -> tuple[np.ndarray, dict]:
        w = as_working(u)
        scaled = w * np.asarray(operands[self.scale], dtype=w.dtype)
        return u, {self.output: store(self.output, scaled, saturating=True),
                   self.amax: np.asarray(np.max(np.abs(w), initial=0.0))}

    def backward(self, dv, u, operands: dict) -> tuple[np.ndarray, dict]:
        return dv, {}


def staged(inner: Callable[[object], dict], stages: tuple, keep: tuple[str, ...] | None,
           store_of: Callable[[object], Callable]) -> Callable[[object], dict]:
    """The reference of `inner` (case inputs -> outputs) with `stages` around it: the stages before it in order on
    x, the inner norm, the stages after it in order on its y; the backward in reverse. Case inputs `i` (a
    dataclass) give x, dy and `extra` (the operands); `store_of(i)(name, a)` is a result rounded to its declared
    dtype. Returns the outputs named in `keep` (None: all)."""
    before = tuple(s for s in stages if s.side == BEFORE)
    after = tuple(s for s in stages if s.side == AFTER)

    def reference(i) -> dict[str, np.ndarray]:
        operands, store = i.extra, store_of(i)
        ins, results, grads = [i.x], {}, {}
        for stage in before:
            v, r = stage.forward(ins[-1], operands, store)
            ins.append(v)
            results.update(r)
        on_inner = replace(i, x=ins[-1])
        if after:
            first = inner(on_inner)
            outs = [first["y"]]
            for stage in after:
                v, r = stage.forward(outs[-1], operands, store)
                outs.append(v)
                results.update(r)
            d = i.dy
            for stage, u in reversed(tuple(zip(after, outs))):
                d, g = stage.backward(d, u, operands)
                grads.update(g)
            # (stages that hand dy through unchanged, a cast's, need no second backward of the norm)
            out = {**(first if d is i.dy else inner(replace(on_inner, dy=d))), "y": outs[-1]}
        else:
            out = inner(on_inner)
        d = out["dx"]
        for stage, u in reversed(tuple(zip(before, ins))):
            d, g = stage.backward(d, u, operands)
            grads.update(g)
        out = {**out, **results, **grads, "dx": d}
        return out if keep is None else {k: v for k, v in out.items() if k in keep}

    return reference
