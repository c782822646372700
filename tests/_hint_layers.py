"""Layers that follow a convention of their own (tests/test_hints.py, tests/test_scalenorm.py), importable by name so
that they run in the isolated worker."""
from normcheck.ops.add_rmsnorm import add_rms_norm
from normcheck.ops.rmsnorm import rms_norm


def add_rms_norm_returning_y(input, residual, normalized_shape, weight, eps):
    """The last norm of a network: y alone, no residual stream returned (returns=y)."""
    return add_rms_norm(input, residual, normalized_shape, weight, eps)[0]


def add_rms_norm_f32_stream(input, residual, normalized_shape, weight, eps):
    """A kernel that keeps the residual stream in float32 whatever residual it is given (`residual_in_fp32`): h always
    float32, y in the input dtype. It takes float32 streams only (--residual-dtype f32 narrows the sweep to them)."""
    h = input.float() + residual.float()
    return rms_norm(h, normalized_shape, weight, eps).to(input.dtype), h


def scale_norm_eps_in_sum(input, normalized_shape, weight, eps):
    """ScaleNorm with eps added to the sum of squares, x · rsqrt(Σx² + eps) · g (eps_at=sum), in float32."""
    import torch
    x = input.float()
    dims = tuple(range(-len(normalized_shape), 0))
    y = x * torch.rsqrt((x * x).sum(dims, keepdim=True) + eps)
    return (y if weight is None else y * weight.float()).to(input.dtype)


def rms_norm_f16_variance(input, normalized_shape, weight=None, eps=None):
    """An RMSNorm whose mean of squares is accumulated in the input dtype (float16 for float16 x: a bug), the rest in
    float32: no convention explains it (it was hinted `--casting before-weight`, which lowered one ratio)."""
    import torch
    dims = tuple(range(-len(normalized_shape), 0))
    ms = (input * input).mean(dims, keepdim=True)  # (in x's dtype)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    y = input.float() * torch.rsqrt(ms.float() + eps)
    return (y if weight is None else y * weight.float()).to(input.dtype)


def _nn():
    import torch
    return torch.nn


class ViTDetLayerNorm(_nn().Module):
    """detectron2's (ViTDet's) LayerNorm: statistics over dim 1 of (N, C, H, W) input, its weight and bias reshaped
    for 4-D input only (weight[:, None, None]): right under --normalized-at channels on 4-D input, wrong on any other
    rank (a shape error, or a broadcast into another shape)."""

    def __init__(self, normalized_shape, eps=1e-6):
        import torch
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(normalized_shape))
        self.bias = torch.nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps

    def forward(self, x):
        x = self._normalised(x)
        return self.weight[:, None, None] * x + self.bias[:, None, None]

    def _normalised(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return (x - u) / (s + self.eps).sqrt()


class UnsqueezedViTDetLayerNorm(ViTDetLayerNorm):
    """ViTDet's LayerNorm with its weight and bias given their new dims one call at a time: as 4-D-only, but no shape
    in its source says so (its 3-D rows are run, and raise)."""

    def forward(self, x):
        x = self._normalised(x)
        return self.weight.unsqueeze(-1).unsqueeze(-1) * x + self.bias.unsqueeze(-1).unsqueeze(-1)


class NormalizeRMSNorm(_nn().Module):
    """lucidrains' RMSNorm: F.normalize(x)·√d·g, which ignores eps (the norm floored at 1e-12 instead), computed in
    x's dtype: no convention normcheck knows describes it, and float32's budget must not be named for its error."""

    def __init__(self, dim):
        import torch
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        import torch.nn.functional as F
        return F.normalize(x, dim=-1) * self.scale * self.gamma


def rms_norm_off_in_y(input, normalized_shape, weight, eps=None):
    """torch's RMSNorm with y nudged by 64 ulps (a float64 bug a few ulps wide), its gradients exact: no convention
    explains it, and float32's budget, which would hide it, must not be named."""
    import torch
    y = torch.nn.functional.rms_norm(input, normalized_shape, weight, eps)
    return y + (y.abs() * 64 * torch.finfo(y.dtype).eps).detach()
