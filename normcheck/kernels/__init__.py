"""Implementations under test that normcheck owns (SyncBN primitives and recipes, GroupNorm kernel)."""
