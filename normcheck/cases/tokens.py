"""Replay tokens (`--case`): one compact, URL-safe string that rebuilds a Case exactly.

    v2.<base64url of compact JSON: every Case field, in FIELDS order>.<crc32 of that JSON, 8 hex>

The version says which field list the payload follows: a token from another version, a damaged
one or one whose checksum does not match is refused with one line (UsageError) instead of
silently replaying some other case. Adding a field to Case means a new version (tests check that
FIELDS names every field). v1 tokens (before normalized_dims) still replay.
"""
from __future__ import annotations

import base64
import binascii
import json
import zlib

from ..core.errors import UsageError
from .case import Case

VERSION = "v2"
FIELDS = ("op", "shape", "dtype", "param_dtype", "x_format", "dy_format", "profile", "eps", "momentum", "affine",
          "groups", "seed", "split", "gamma_scale", "normalized_dims")
_READS = {"v1": FIELDS[:-1], VERSION: FIELDS}  # the field list each readable version follows


def encode_case(case: Case) -> str:
    values = [getattr(case, name) for name in FIELDS]
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
        values = json.loads(payload)
        fields = _READS[version]
        if not isinstance(values, list) or len(values) != len(fields):
            raise ValueError(f"expected {len(fields)} fields")
        kw = dict(zip(fields, values))
        for name in ("shape", "split"):
            if kw[name] is not None:
                kw[name] = tuple(kw[name])
        return Case(**kw)
    except UsageError as e:
        raise UsageError(f"--case token names an invalid case: {e}") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"--case token {_short(token)} does not hold a case: {e}") from None


def _short(token: str) -> str:
    return repr(token if len(token) <= 40 else token[:37] + "...")

