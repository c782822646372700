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
