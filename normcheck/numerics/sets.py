"""Normalisation sets: which elements share one mean and one variance.

Every op here is one reduction over `axes` of x viewed as (N, K, L, S), with γ and β indexed by
(K, L) (flattened: the parameter shape) and one saved statistic per set:
  per_channel (BatchNorm)   x (N, C, *S)        K = C, L = 1    sets are channels, across the batch:
                                                                reduce over (N, L, S)
  per_group   (GroupNorm)   x (N, C, *S)        K = G, L = C/G  sets are (sample, group): reduce over (L, S)
  last_dims   (LayerNorm)   x (*rows, *D), k = len(D)           N = rows, K = 1, L = prod(D), S = 1: sets
                                                                are rows, γ and β per element of D
  leading_dims (LayerNorm   x (N, *D, *T), k = len(D)           N = N, K = 1, L = prod(D), S = prod(T): sets
  channels-first)                                               are (sample, position in T): reduce over L
                                                                only, γ and β per element of D
The op record (normcheck.ops) says which view its cases take, and the view the set's statistic form
(numerics.statistics.StatisticForm: how the statistic is formed from the deviations, how r comes from it and eps).
Works for NumPy arrays (and anything with NumPy's reshape/transpose/sum spelling).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .statistics import STANDARD, StatisticForm


@dataclass(frozen=True)
class SetView:
    shape: tuple[int, ...]
    grouped_shape: tuple[int, int, int, int]  # (N, K, L, S)
    across_batch: bool   # sets span the batch (BatchNorm) or stay within a sample (GroupNorm, LayerNorm)
    param_shape: tuple[int, ...]  # γ, β and their gradients
    stats_shape: tuple[int, ...]  # saved mean and invstd/rstd: one per set
    s_in_sets: bool = True  # S is reduced within a set (False: channels-first LayerNorm, one set per position)
    # The grouped axes a parameter is indexed over: (K, L), γ per channel or per element of D; () for one scalar
    # gain (ScaleNorm's g), whose gradient sums over every element
    param_axes: tuple[int, ...] = (1, 2)
    # How the set's statistic s is formed and r from it: 1/√(mean(d²) + eps) unless the op declares another form
    # (ScaleNorm's total Σx² under a floor, 1/max(‖x‖, eps); the annotated transformer's 1/(std + eps))
    form: StatisticForm = STANDARD

    @classmethod
    def per_channel(cls, shape: tuple[int, ...]) -> "SetView":
        n, c = shape[0], shape[1]
        return cls(tuple(shape), (n, c, 1, prod(shape[2:])), True, (c,), (c,))

    @classmethod
    def per_group(cls, shape: tuple[int, ...], groups: int) -> "SetView":
        n, c = shape[0], shape[1]
        return cls(tuple(shape), (n, groups, c // groups, prod(shape[2:])), False, (c,), (n, groups))

    @classmethod
    def last_dims(cls, shape: tuple[int, ...], dims: int) -> "SetView":
        rows, normalised = tuple(shape[:-dims]), tuple(shape[-dims:])
        return cls(tuple(shape), (prod(rows), 1, prod(normalised), 1), False, normalised, rows + (1,) * dims)

    @classmethod
    def leading_dims(cls, shape: tuple[int, ...], dims: int) -> "SetView":
        n, normalised, trailing = shape[0], tuple(shape[1:1 + dims]), tuple(shape[1 + dims:])
        return cls(tuple(shape), (n, 1, prod(normalised), prod(trailing)), False, normalised,
                   (n,) + (1,) * dims + trailing, s_in_sets=False)

    @property
    def blocks(self) -> int:
        """K: channel blocks (C for per-channel sets, G for groups, 1 for LayerNorm)."""
        return self.grouped_shape[1]

    @property
    def axes(self) -> tuple[int, ...]:
        return (0, 2, 3) if self.across_batch else (2, 3) if self.s_in_sets else (2,)

    @property
    def set_size(self) -> int:
        n, _, l, s = self.grouped_shape
        return (n * l * s) if self.across_batch else (l * s) if self.s_in_sets else l

    @property
    def channel_count(self) -> int:
        """Elements that feed one parameter's dγ/dβ: N·S (BatchNorm, GroupNorm: N·spatial; LayerNorm: rows; a
        scalar: every element)."""
        return prod(self.grouped_shape[a] for a in self.param_summed_axes)

    @property
    def param_summed_axes(self) -> tuple[int, ...]:
        """The grouped axes a parameter's gradient sums over: N and S, or every axis for a scalar."""
        return tuple(a for a in range(4) if a not in self.param_axes)

    def mean(self, a):
        """The set's mean of a grouped array, kept broadcastable (what centring subtracts: μ, ḡ)."""
        return a.mean(axis=self.axes, keepdims=True)

    def reduce(self, a):
        """The set's statistic of a grouped array, kept broadcastable: Σa/D as its form says (the mean, the total,
        Σa/(M − 1))."""
        return self.form.reduce(a, self.axes, self.set_size)

    def eps_as_mean_square(self, eps: float) -> float:
        """The mean square of a set's values at which eps and its statistic are the same size (what the data
        profiles aim at eps: StatisticForm.eps_as_mean_square)."""
        return self.form.eps_as_mean_square(eps, self.set_size)

    @property
    def set_count(self) -> int:
        n, k, _, s = self.grouped_shape
        return k if self.across_batch else n * k if self.s_in_sets else n * k * s

    def to_sets(self, a):
        """NumPy x-shaped -> (sets, set_size): one row per normalisation set."""
        g = self.group(a)
        if self.across_batch:
            g = g.transpose(1, 0, 2, 3)
        elif not self.s_in_sets:
            g = g.transpose(0, 1, 3, 2)
        return g.reshape(self.set_count, self.set_size)

    def from_sets(self, m):
        """Inverse of to_sets (NumPy)."""
        n, k, l, s = self.grouped_shape
        if self.across_batch:
            return m.reshape(k, n, l, s).transpose(1, 0, 2, 3).reshape(self.shape)
        if not self.s_in_sets:
            return m.reshape(n, k, s, l).transpose(0, 1, 3, 2).reshape(self.shape)
        return m.reshape(self.shape)

    def group(self, a):
        """x-shaped -> (N, K, L, S)."""
        return a.reshape(self.grouped_shape)

    def ungroup(self, a):
        return a.reshape(self.shape)

    def per_channel_values(self, v):
        """A parameter (param_shape) -> broadcastable against the grouped view."""
        return v.reshape(tuple(n if a in self.param_axes else 1 for a, n in enumerate(self.grouped_shape)))

    def channel_sum(self, a):
        """Sum a grouped array over what shares a parameter: (N, K, L, S) -> param_shape."""
        return a.sum(axis=self.param_summed_axes).reshape(self.param_shape)
