"""Replay tokens (`--case`): one compact, URL-safe string that rebuilds a Case exactly.

    v3.<base64url of compact JSON: {field: value} for every Case field, absent ones (None) left out>
       .<crc32 of that JSON, 8 hex>

A token from an unknown version, a damaged one, one whose checksum does not match or one naming a
field this normcheck does not have is refused with one line (UsageError) instead of silently
replaying some other case. v3 names its fields, so a field added to Case later (with a default
that keeps older cases as they were) needs no new version. v1 and v2 tokens (lists in a fixed field
order, before the weight offset and casting chain) still replay.
"""
from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import fields as dataclass_fields

from ..core.errors import UsageError
from .case import FIELD_NAMES, OP_FIELDS, Case

VERSION = "v3"
FIELDS = FIELD_NAMES
_ABSENT = {f.name for f in dataclass_fields(Case) if f.default is None} | set(OP_FIELDS)  # None: the field is absent
# Fields added after v3 that are left out at their default value, so tokens of the cases that existed
# before them stay as they were
_QUIET = {name: f.default for f in dataclass_fields(Case) if (name := f.name) in ("mode", "frozen", "order", "output_dtype",
                                                                                 "compute_dtype")}
_QUIET["normalized_at"] = "trailing"  # (an op field: None for the ops without it, "trailing" by default for the rest)
_QUIET["running_stats"] = "yes"
_V2 = ("op", "shape", "dtype", "param_dtype", "x_format", "dy_format", "profile", "eps", "momentum", "affine",
       "groups", "seed", "split", "gamma_scale", "normalized_dims")
_LISTS = {"v1": _V2[:-1], "v2": _V2}  # the field order of each older, list-shaped version
_READS = (*_LISTS, VERSION)


def encode_case(case: Case) -> str:
    values = {name: getattr(case, name) for name in FIELDS  # (shorter lines; decoding restores them)
              if not (name in _ABSENT and getattr(case, name) is None)
              and not (name in _QUIET and getattr(case, name) == _QUIET[name])}
    payload = json.dumps(values, separators=(",", ":"), allow_nan=True).encode()
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{VERSION}.{body}.{zlib.crc32(payload):08x}"


def decode_case(token: str) -> Case:
    """The Case a token names; UsageError (one line) for anything else."""
    parts = token.strip().split(".")
    if len(parts) != 3 or not parts[0].startswith("v"):
        raise UsageError(f"--case {_short(token)} is not a normcheck replay token (expected {VERSION}.<data>.<checksum>)")
    version, body, checksum = parts
    if version not in _READS:
        raise UsageError(f"--case token is version {version}; this normcheck reads {' and '.join(_READS)} tokens: "
                         f"re-run the check with this version to get a new replay line")
    try:
        payload = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise UsageError(f"--case token {_short(token)} is damaged (not base64url)") from None
    if f"{zlib.crc32(payload):08x}" != checksum:
        raise UsageError(f"--case token {_short(token)} is damaged (checksum mismatch): copy the whole replay line")
    try:
        kw = _fields(version, json.loads(payload))
        for name in ("shape", "split"):
            if kw.get(name) is not None:
                kw[name] = tuple(kw[name])
        return Case(**kw)
    except UsageError as e:
        raise UsageError(f"--case token names an invalid case: {e}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"--case token {_short(token)} does not hold a case: {e}") from None


def _fields(version: str, values) -> dict:
    if version in _LISTS:
        names = _LISTS[version]
        if not isinstance(values, list) or len(values) != len(names):
            raise ValueError(f"expected {len(names)} fields")
        return dict(zip(names, values))
    if not isinstance(values, dict):
        raise ValueError("expected named fields")
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ValueError(f"this normcheck has no case field {', '.join(unknown)}: it is older than the token")
    return values


def _short(token: str) -> str:
    return repr(token if len(token) <= 40 else token[:37] + "...")

