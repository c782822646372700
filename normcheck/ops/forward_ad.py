"""torch's forward-mode AD of its norms: the known issues its forward-AD formulas share across ops (each op's
record names the formula and the aten kernel), found by the forward-mode paths (Case.order fwd, fwd-rev)."""
from __future__ import annotations

from .core import JVPS, KnownIssue, Signature


def forward_ad_issues(op: str, name: str, formula: str, kernel: str, example: str) -> tuple[KnownIssue, ...]:
    """The two failures of torch's forward-mode formulas for `name` (`formula`, derivatives.yaml) seen on every norm
    that has them: the tangent of a mixed-precision y in float32, and half-precision overflow. `op`: the key's op
    part; `kernel`: the aten op whose forward derivative it is; `example`: a measured case."""
    return (
        KnownIssue(
            f"torch-{op}-jvp-mixed-dtype",
            f"torch's {name} forward-mode derivative ({formula}) of f16/bf16 input with f32 parameters returns y's "
            f"tangent in float32 while y is f16/bf16 where x, γ and β do not all carry a tangent (all three: y's "
            f"dtype): a tangent in another dtype than its primal (make_dual refuses one for an input). The values are "
            f"right",
            lambda c: c.forward_mode and c.dtypes.is_mixed,
            Signature(message=r"jvp_y has dtype f32, expected (f16|bf16)"),
            code=(kernel,),
        ),
        KnownIssue(
            f"torch-{op}-half-forward-ad",
            f"torch's {name} forward-mode formulas ({formula}) and the differentiable backward that fwd-rev runs under "
            f"create_graph compute in the input dtype with f16/bf16 input (also with f32 parameters): rstd³ and the "
            f"products overflow f16 on near-constant or tiny sets and half-precision sums lose the rest, so y's "
            f"tangent, the gradients' tangents and, at fwd-rev, the gradients themselves come back NaN, inf or "
            f"inaccurate where every exact value is representable ({example})",
            lambda c: c.forward_mode and c.dtype in ("f16", "bf16"),
            Signature(JVPS + ("dx", "dweight", "dbias"), max_ratio=1e4, nonfinite=True),
            code=(kernel,),
        ),
    )
