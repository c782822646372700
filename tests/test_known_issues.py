"""Every recorded upstream issue reproduces on the torch it was recorded with, and is attributed.

If torch fixes one of these, the matching test fails: drop the record then (and celebrate).
"""
import pytest
import torch
import torch.nn.functional as F

from dataclasses import replace

from normcheck import Case, compare, resolve_impl
from normcheck.engine import FAIL, KNOWN
from normcheck.impls import IMPLS
from normcheck.ops import RECORDED_WITH_TORCH, batchnorm as bn, groupnorm as gn, syncbn

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith(RECORDED_WITH_TORCH),
    reason=f"known issues were recorded with torch {RECORDED_WITH_TORCH}, this is {torch.__version__}",
)


def bare(op: str, name: str):
    """A registered torch implementation with its known-issue records dropped."""
    return replace(IMPLS[op][name], name=f"bare-{name}", known_issues=())


BARE_BN = resolve_impl("batchnorm", F.batch_norm)
BARE_GN = resolve_impl("groupnorm", F.group_norm)

WITNESSES = [
    (bn.MIXED_SLOW_PATH, "batchnorm", BARE_BN,
     Case("batchnorm", (2, 3, 2, 2), "bf16", "f32", "contiguous", "channels_last"), "dbias"),
    (bn.F16_INTERMEDIATES, "batchnorm", BARE_BN, Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset"), "dweight"),
    (bn.CHANNELS_LAST_F32_CANCELLATION, "batchnorm", BARE_BN,
     Case("batchnorm", (16, 3, 4, 32, 32), "f32", x_format="channels_last_3d", profile="offset"), "dx"),
    (gn.CHANNELS_LAST_VARIANCE, "groupnorm", BARE_GN,
     Case("groupnorm", (2, 8, 32, 64), "f32", x_format="channels_last", profile="offset", groups=2), "dx"),
    (gn.MIXED_MOMENTS, "groupnorm", BARE_GN,
     Case("groupnorm", (2, 11, 46, 3), "f16", "f32", profile="offset", groups=11, affine=False, seed=1), "dx"),
    (gn.F16_OVERFLOW, "groupnorm", BARE_GN, Case("groupnorm", (2, 8, 128, 128), "f16", profile="offset", groups=2),
     "dweight"),
    (syncbn.EMPTY_RANK_HALF, "syncbn", bare("syncbn", "torch"),
     Case("syncbn", (8, 3, 5, 7), "bf16", split=(3, 0, 5)), None),
    (gn.NATIVE_DY_LAYOUT, "groupnorm", bare("groupnorm", "torch-native-backward"),
     Case("groupnorm", (5, 12, 30), "f64", None, "contiguous", "strided", "exact", groups=6), "dx"),
]


@pytest.mark.parametrize("issue, op, bare, case, tensor", WITNESSES, ids=[w[0].key for w in WITNESSES])
def test_issue_reproduces_and_is_attributed(issue, op, bare, case, tensor):
    assert issue.applies(case)
    plain = compare(op, bare, case)
    if tensor is None:  # a rank dies; the same case through our torch>=1.9-style recipe passes
        assert plain.verdict == FAIL and "died" in plain.message
        assert compare(op, resolve_impl(op, "torch19", "gloo"), case).verdict != FAIL
    else:
        assert plain.verdict == FAIL and plain.worst.name == tensor and plain.worst.max_ratio > 10
    registered = [resolve_impl(op, i) for i in IMPLS[op].values() if issue in i.known_issues]
    registered = [i for i in registered if i.unsupported(case) is None]
    assert registered
    for impl in registered:  # every registered implementation that takes the case attributes it
        report = compare(op, impl, case)
        assert report.verdict == KNOWN and report.message.startswith(f"known issue {issue.key}:")


def test_known_issues_do_not_cover_the_plain_cases():
    plain = Case("groupnorm", (2, 8, 32, 64), "f32", groups=2, profile="offset")
    for impl in IMPLS["groupnorm"].values():
        assert impl.known_issue(plain) is None
    assert compare("groupnorm", "torch", plain).verdict != KNOWN
