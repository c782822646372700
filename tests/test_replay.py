"""Replay tokens: every case survives the round trip, and a bad token is one line, never another case."""
import base64
import dataclasses
import json
import re
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from normcheck import Case, UsageError
from normcheck.ops import CASE_FIELDS, OPS
from normcheck.cases.tokens import FIELDS, decode_case, encode_case
from normcheck.outputs.replay import replay_command
from normcheck.cases.strategies import cases


@given(st.sampled_from(list(OPS)).flatmap(cases), st.sampled_from([1.0, 1e-4, 0.37]))
def test_every_case_round_trips_exactly(case, gamma_scale):
    case = case.with_(gamma_scale=gamma_scale)
    token = encode_case(case)
    assert re.fullmatch(r"v3\.[A-Za-z0-9_-]+\.[0-9a-f]{8}", token)  # URL-safe, no padding, no spaces
    again = decode_case(token)
    assert again == case
    # Equal is not enough for floats written as text: the data made from them must be identical.
    assert (again.eps, again.momentum, again.gamma_scale) == (case.eps, case.momentum, case.gamma_scale)


def test_the_token_holds_every_case_field():
    # A new Case field must go into the token, or replays would drop it.
    assert set(FIELDS) == {f.name for f in dataclasses.fields(Case)} - {"own"} | set(CASE_FIELDS)  # own: by name
    rms = encode_case(Case("rmsnorm", (4, 6), normalized_dims=1, weight_offset=1.0, eps=None))
    # absent ones are left out, and so are the path fields at their defaults (tokens from before them stay the same)
    quiet = {"mode", "frozen", "order", "output_dtype", "compute_dtype", "normalized_at"}
    others = set(CASE_FIELDS) - set(OPS["rmsnorm"].case_fields)  # (other ops' own fields)
    assert set(json.loads(_payload(rms))) == set(FIELDS) - others - {"split", "fp8"} - quiet
    sequence = Case("layernorm_sp", (5, 6), split=(2, 0, 3), reduces_grads="no")
    assert json.loads(_payload(encode_case(sequence)))["reduces_grads"] == "no" and \
        decode_case(encode_case(sequence)) == sequence
    path = encode_case(Case("rmsnorm", (4, 6), normalized_dims=1, frozen="x", order=2))
    assert {"frozen", "order"} <= set(json.loads(_payload(path)))
    declared = Case("layernorm", (4, 6), dtype="bf16", param_dtype="f32", output_dtype="promote", compute_dtype="f32")
    assert {"output_dtype", "compute_dtype"} <= set(json.loads(_payload(encode_case(declared))))
    assert decode_case(encode_case(declared)) == declared
    channels = Case("rmsnorm", (4, 6, 5), normalized_dims=1, normalized_at="channels")
    assert json.loads(_payload(encode_case(channels)))["normalized_at"] == "channels"
    assert decode_case(encode_case(channels)) == channels
    fp8 = Case("layernorm", (4, 6), normalized_dims=1, fp8="e5m2")  # (absent without it: older tokens stay the same)
    assert json.loads(_payload(encode_case(fp8)))["fp8"] == "e5m2" and decode_case(encode_case(fp8)) == fp8


def _payload(token: str) -> bytes:
    body = token.split(".")[1]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def _token(values, version="v3") -> str:
    payload = json.dumps(values, separators=(",", ":")).encode()
    return f"{version}.{base64.urlsafe_b64encode(payload).decode().rstrip('=')}.{zlib.crc32(payload):08x}"


GOOD = encode_case(Case("groupnorm", (2, 8, 4), "bf16", "f32", groups=4, seed=7))
_V2 = ("op", "shape", "dtype", "param_dtype", "x_format", "dy_format", "profile", "eps", "momentum", "affine",
       "groups", "seed", "split", "gamma_scale", "normalized_dims")  # the field order of v2 tokens
_FIELDS = [getattr(Case("batchnorm", (2, 3)), f) for f in _V2]
_NAMED = {f: getattr(Case("batchnorm", (2, 3)), f) for f in FIELDS}


@pytest.mark.parametrize("token, message", [
    ("hello", "is not a normcheck replay token"),
    ("", "is not a normcheck replay token"),
    ("v4." + GOOD[3:], "version v4; this normcheck reads v1 and v2 and v3"),
    (GOOD[:10] + ("B" if GOOD[10] == "A" else "A") + GOOD[11:], "damaged (checksum mismatch)"),  # a typo
    (GOOD[:20] + GOOD[-9:], "damaged"),                           # cut in the middle
    ("v3.@@@@.00000000", "damaged (not base64url)"),
    (_token(_FIELDS, "v1"), "does not hold a case: expected 14 fields"),  # a v1 token has no normalized_dims
    (_token([1, 2, 3], "v2"), "does not hold a case"),
    (_token(_FIELDS), "does not hold a case: expected named fields"),  # a v2 list under v3
    (_token({"op": "batchnorm"}), "does not hold a case"),
    (_token({**_NAMED, "shape": [2, -3]}), "names an invalid case: shape 2x-3"),
    (_token({**_NAMED, "op": "instancenorm2"}), "unknown op 'instancenorm2'"),
    (_token({**_NAMED, "bias_only": True}), "has no case field bias_only: it is older than the token"),
])
def test_bad_tokens_are_one_line_usage_errors(token, message):
    with pytest.raises(UsageError) as e:
        decode_case(token)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_tokens_of_older_versions_still_replay():
    case = Case("groupnorm", (2, 8, 4), "bf16", "f32", groups=4, seed=7)
    assert decode_case(_token([getattr(case, f) for f in _V2[:-1]], "v1")) == case  # before normalized_dims
    ln = Case("layernorm", (4, 6), normalized_dims=1, seed=3)
    assert decode_case(_token([getattr(ln, f) for f in _V2], "v2")) == ln  # before the RMSNorm conventions


def test_replay_command_names_impl_case_and_world():
    case = Case("syncbn", (8, 3, 5), split=(3, 0, 5))
    line = replay_command("syncbn", "my pkg/sync.py:fn", case, "lockstep")
    token = encode_case(case)
    assert line == f"normcheck compare --op syncbn --impl 'my pkg/sync.py:fn' --case {token} --backend lockstep"
