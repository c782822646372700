"""Normalisation sets: which elements share one mean and one variance.

The ops here normalise x of shape (N, C, *spatial) over sets. Viewing x as (N, K, L, S), with the
C channels in K blocks of L, makes every op one reduction over `axes`:
  per_channel (BatchNorm)    K = C, L = 1    sets are channels, across the batch: reduce over (N, L, S)
  per_group   (GroupNorm)    K = G, L = C/G  sets are (sample, group):           reduce over (L, S)
γ and β are per channel, i.e. indexed by (K, L) in this view; saved statistics have one value per
set. The op record (normcheck.ops) says which view its cases take. Works for NumPy arrays (and
anything with NumPy's reshape/transpose/sum spelling).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class SetView:
    shape: tuple[int, ...]
    blocks: int          # K: channel blocks (C for per-channel sets, G for groups)
    across_batch: bool   # sets span the batch (BatchNorm) or stay within a sample (GroupNorm)

    @classmethod
    def per_channel(cls, shape: tuple[int, ...]) -> "SetView":
        return cls(tuple(shape), shape[1], True)

    @classmethod
    def per_group(cls, shape: tuple[int, ...], groups: int) -> "SetView":
        return cls(tuple(shape), groups, False)

    @property
    def grouped_shape(self) -> tuple[int, int, int, int]:
        n, c = self.shape[0], self.shape[1]
        return (n, self.blocks, c // self.blocks, prod(self.shape[2:]))

    @property
    def axes(self) -> tuple[int, ...]:
        return (0, 2, 3) if self.across_batch else (2, 3)

    @property
    def set_size(self) -> int:
        n, _, l, s = self.grouped_shape
        return (n * l * s) if self.across_batch else (l * s)

    @property
    def channel_count(self) -> int:
        """Elements that feed one channel's dγ/dβ: N·spatial, for both views."""
        n, _, _, s = self.grouped_shape
        return n * s

    @property
    def set_count(self) -> int:
        n, k, _, _ = self.grouped_shape
        return k if self.across_batch else n * k

    @property
    def stats_shape(self) -> tuple[int, ...]:
        """Saved mean and invstd/rstd: one per set, (C,) across the batch, (N, G) within samples."""
        n, k, _, _ = self.grouped_shape
        return (k,) if self.across_batch else (n, k)

    def to_sets(self, a):
        """NumPy (N, C, *S) -> (sets, set_size): one row per normalisation set."""
        g = self.group(a)
        if self.across_batch:
            g = g.transpose(1, 0, 2, 3)
        return g.reshape(self.set_count, self.set_size)

    def from_sets(self, m):
        """Inverse of to_sets (NumPy)."""
        n, k, l, s = self.grouped_shape
        if self.across_batch:
            return m.reshape(k, n, l, s).transpose(1, 0, 2, 3).reshape(self.shape)
        return m.reshape(self.shape)

    def group(self, a):
        """(N, C, *S) -> (N, K, L, S)."""
        return a.reshape(self.grouped_shape)

    def ungroup(self, a):
        return a.reshape(self.shape)

    def per_channel_values(self, v):
        """(C,) -> broadcastable against the grouped view."""
        _, k, l, _ = self.grouped_shape
        return v.reshape(1, k, l, 1)

    def channel_sum(self, a):
        """Sum a grouped array over N and S: (N, K, L, S) -> (C,)."""
        return a.sum(axis=(0, 3)).reshape(-1)
