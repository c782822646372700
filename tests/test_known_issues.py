"""Every recorded upstream issue reproduces on the torch it was recorded with, and is attributed.

If torch fixes one of these, the matching test fails: drop the record then (and celebrate).
"""
import pytest
import torch
import torch.nn.functional as F

from normcheck import Case, Impl, compare, resolve_impl
from normcheck import known_issues as k
from normcheck.compare import FAIL, KNOWN
from normcheck.registry import IMPLS
from normcheck.runners import native_groupnorm_backward

pytestmark = pytest.mark.skipif(
    not torch.__version__.startswith(k.RECORDED_WITH_TORCH),
    reason=f"known issues were recorded with torch {k.RECORDED_WITH_TORCH}, this is {torch.__version__}",
)

# The same torch entry points, registered without any known-issue records.
BARE_BN = resolve_impl("batchnorm", F.batch_norm)
BARE_GN = resolve_impl("groupnorm", F.group_norm)
BARE_GN_NATIVE = Impl("bare-native", "groupnorm", "native_group_norm_backward, no records", native_groupnorm_backward)

WITNESSES = [
    (k.BN_MIXED_SLOW_PATH, "batchnorm", BARE_BN,
     Case("batchnorm", (2, 3, 2, 2), "bf16", "f32", "contiguous", "channels_last"), "dbias"),
    (k.BN_F16_INTERMEDIATES, "batchnorm", BARE_BN, Case("batchnorm", (8, 3, 32, 32), "f16", profile="offset"), "dweight"),
    (k.BN_CHANNELS_LAST_F32_CANCELLATION, "batchnorm", BARE_BN,
     Case("batchnorm", (16, 3, 4, 32, 32), "f32", x_format="channels_last_3d", profile="offset"), "dx"),
    (k.GN_CHANNELS_LAST_VARIANCE, "groupnorm", BARE_GN,
     Case("groupnorm", (2, 8, 32, 64), "f32", x_format="channels_last", profile="offset", groups=2), "dx"),
    (k.GN_MIXED_MOMENTS, "groupnorm", BARE_GN,
     Case("groupnorm", (2, 11, 46, 3), "f16", "f32", profile="offset", groups=11, affine=False, seed=1), "dx"),
    (k.GN_F16_OVERFLOW, "groupnorm", BARE_GN, Case("groupnorm", (2, 8, 128, 128), "f16", profile="offset", groups=2),
     "dweight"),
    (k.SYNCBN_EMPTY_RANK_HALF, "syncbn", Impl("bare-torch", "syncbn", "torch's Function, no records",
                                              IMPLS["syncbn"]["torch"].run),
     Case("syncbn", (8, 3, 5, 7), "bf16", split=(3, 0, 5)), None),
    (k.GN_NATIVE_DY_LAYOUT, "groupnorm", BARE_GN_NATIVE,
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
    registered = [i for i in IMPLS[op].values() if issue in i.known_issues and i.supports(case) is None]
    assert registered
    for impl in registered:  # every registered implementation that takes the case attributes it
        report = compare(op, impl, case)
        assert report.verdict == KNOWN and report.message.startswith(f"known issue {issue.key}:")


def test_known_issues_do_not_cover_the_plain_cases():
    plain = Case("groupnorm", (2, 8, 32, 64), "f32", groups=2, profile="offset")
    for impl in IMPLS["groupnorm"].values():
        assert impl.known_issue(plain) is None
    assert compare("groupnorm", "torch", plain).verdict != KNOWN
