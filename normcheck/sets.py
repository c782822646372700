"""Normalisation sets: which elements share one mean and one variance.

Every op here normalises x of shape (N, C, *spatial) over sets. Viewing x as (N, K, L, S) makes
both ops one reduction over `axes`:
  BatchNorm  K = C, L = 1    sets are channels,       reduce over (N, L, S)
  GroupNorm  K = G, L = C/G  sets are (sample, group), reduce over (L, S)
γ and β are per channel, i.e. indexed by (K, L) in this view. Works for NumPy arrays and torch tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class SetView:
    shape: tuple[int, ...]
    groups: int | None  # None: BatchNorm (one set per channel)

    @property
    def grouped_shape(self) -> tuple[int, int, int, int]:
        n, c = self.shape[0], self.shape[1]
        s = prod(self.shape[2:])
        if self.groups is None:
            return (n, c, 1, s)
        return (n, self.groups, c // self.groups, s)

    @property
    def axes(self) -> tuple[int, ...]:
        return (0, 2, 3) if self.groups is None else (2, 3)

    @property
    def set_size(self) -> int:
        n, _, l, s = self.grouped_shape
        return (n * l * s) if self.groups is None else (l * s)

    @property
    def channel_count(self) -> int:
        """Elements that feed one channel's dγ/dβ: N·spatial, for both ops."""
        n, _, _, s = self.grouped_shape
        return n * s

    @property
    def set_count(self) -> int:
        n, k, _, _ = self.grouped_shape
        return k if self.groups is None else n * k

    def to_sets(self, a):
        """NumPy (N, C, *S) -> (sets, set_size): one row per normalisation set."""
        g = self.group(a)
        if self.groups is None:
            g = g.transpose(1, 0, 2, 3)
        return g.reshape(self.set_count, self.set_size)

    def from_sets(self, m):
        """Inverse of to_sets (NumPy)."""
        n, k, l, s = self.grouped_shape
        if self.groups is None:
            return m.reshape(k, n, l, s).transpose(1, 0, 2, 3).reshape(self.shape)
        return m.reshape(self.shape)

    def group(self, a):
        """(N, C, *S) -> (N, K, L, S)."""
        return a.reshape(self.grouped_shape)

    def ungroup(self, a):
        return a.reshape(self.shape)

    def per_channel(self, v):
        """(C,) -> broadcastable against the grouped view."""
        _, k, l, _ = self.grouped_shape
        return v.reshape(1, k, l, 1)

    def channel_sum(self, a):
        """Sum a grouped array over N and S: (N, K, L, S) -> (C,)."""
        return a.sum(axis=(0, 3)).reshape(-1)  # torch accepts numpy's `axis` spelling too
