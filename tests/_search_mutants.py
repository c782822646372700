"""A LayerNorm with a bug on a size path the default sweep never reaches: what the budgeted search is for
(tests/test_search.py).

Kernels keep tables of tilings specialised for the hidden sizes models use: 2816 = 11·256 (a Llama-family
intermediate size) runs as 11 tiles of 256. This one's 11- and 13-tile entries (H = 11·2^j or 13·2^j, tiles of
2^j >= 8 values) read the last tile's β one tile early: y is wrong in the last tile's columns, dβ in the last two
tiles'. The sweep's sizes are its design's levels and k·2^j − 1, k·2^j, k·2^j + 1 for small k (1, 3, ...): never 11
or 13 tiles. Not in any MUTANTS dict: tests/test_ops.py demands the sweep catch those.
"""
from __future__ import annotations

from math import prod

import torch
import torch.nn.functional as F

TILE_COUNTS = (11, 13)
SMALLEST_TILE = 8


def tile_of(hidden: int) -> int | None:
    """The tile width of the specialised entry for a row of `hidden` values (None: the generic kernel)."""
    for count in TILE_COUNTS:
        tile = hidden // count
        if hidden % count == 0 and tile >= SMALLEST_TILE and tile & (tile - 1) == 0:
            return tile
    return None


def tile_table_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    tile = tile_of(prod(normalized_shape))
    if bias is not None and tile is not None:
        flat = bias.reshape(-1)  # the last tile's β pointer is one tile short
        bias = torch.cat([flat[:-tile], flat[-2 * tile:-tile]]).reshape(bias.shape)
    return F.layer_norm(input, normalized_shape, weight, bias, eps)
