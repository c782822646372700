"""A first-order running-error analysis: the same formulas as the reference, evaluated on (value, bound) pairs.

Each `Tracked` carries a float64 value and a bound on how far an implementation that rounds every operation may
have drifted from it. Exact inputs start at bound 0; each operation adds what its operands' bounds become through
it (|a|·δb + δa·|b| for a product) plus its own rounding, u_o·|result| (the storage dtype's unit roundoff: a
composite double backward in torch runs its element-wise steps in the input dtype). A mean over M values adds
u_a·ρ(M)·mean|a|, the accumulation error of the sum (tolerance.py explains ρ). The result is a bound, before a
calibrated constant, for the second-order outputs (reference.setwise), whose error is not yet derived by hand
the way tolerance.py derives the first-order ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..reference.setwise import Arithmetic


# The bound of a value known exactly: a scalar, so that the terms it enters (|a|·0) are skipped, not computed
EXACT = 0.0


@dataclass(frozen=True)
class Tracked:
    value: np.ndarray
    bound: np.ndarray | float  # (EXACT for an exact value)
    u: float  # the element-wise steps' unit roundoff

    def _lift(self, other) -> "Tracked":
        return other if isinstance(other, Tracked) else exact(other, self.u)

    def _rounded(self, value, bound) -> "Tracked":
        return Tracked(value, bound + self.u * np.abs(value), self.u)

    def __add__(self, other):
        other = self._lift(other)
        return self._rounded(self.value + other.value, _plus(self.bound, other.bound))

    def __sub__(self, other):
        other = self._lift(other)
        return self._rounded(self.value - other.value, _plus(self.bound, other.bound))

    def __mul__(self, other):
        other = self._lift(other)
        return self._rounded(self.value * other.value,
                             _plus(_times(self.value, other.bound), _times(other.value, self.bound)))

    __radd__ = __add__
    __rmul__ = __mul__

    def __rsub__(self, other):
        return self._lift(other) - self


def _is_exact(bound) -> bool:
    return isinstance(bound, float) and bound == EXACT


def _plus(a, b):
    """a + b of two bounds, either of them EXACT."""
    return b if _is_exact(a) else a if _is_exact(b) else a + b


def _times(value, bound):
    """|value|·bound: what a factor's error becomes through a product."""
    return EXACT if _is_exact(bound) else np.abs(value) * bound


def _through(reduce, bound):
    """A bound carried through a sum or mean of what it bounds (EXACT stays EXACT)."""
    return EXACT if _is_exact(bound) else reduce(bound)


def exact(a, u: float) -> Tracked:
    """An input known exactly (the case's quantised values)."""
    return Tracked(np.asarray(a, dtype=np.float64), EXACT, u)


def tracked_arithmetic(view, ua: float, growth: float) -> Arithmetic:
    """A view's set means and statistics (in its form: SetView.reduce) over sets of its set_size and parameter sums
    over its channel_count terms, accumulated at ua; the form's functions of a statistic carried through their own
    error maps (numerics.statistics: an error in s, and the value's own rounding unless it is exact)."""
    def rho(n):
        return growth * np.sqrt(max(n, 1))

    def reduced(reduce):
        def over_set(a: Tracked) -> Tracked:
            accumulated = ua * rho(view.set_size) * reduce(np.abs(a.value))
            return a._rounded(reduce(a.value), _plus(_through(reduce, a.bound), accumulated))
        return over_set

    def total(a: Tracked) -> Tracked:
        value, count = view.channel_sum(a.value), view.channel_count
        accumulated = ua * rho(count) * view.channel_sum(np.abs(a.value))
        return a._rounded(value, _plus(_through(view.channel_sum, a.bound), accumulated))

    def apply(value, error, s: Tracked, rounded: bool = True) -> Tracked:
        """value(s), moved by error(value, s, δs) (a statistic within its error of a floor: a mask uncertain there,
        bound 1)."""
        with np.errstate(divide="ignore"):
            v = value(s.value)
        bound = error(v, s.value, s.bound)
        return s._rounded(v, bound) if rounded else Tracked(v, bound, s.u)

    def either(a: Tracked, b: Tracked) -> Tracked:
        return Tracked(a.value, np.maximum(a.bound, b.bound), a.u)

    return Arithmetic(mean=reduced(view.mean), statistic=reduced(view.reduce), param_sum=total, apply=apply,
                      either=either, form=view.form)
