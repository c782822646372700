"""Normalization layers written as popular model libraries write them, each in a few lines under normcheck's
contract: they follow conventions of their own (the dtype y comes back in, float32 compute, where they round),
which a run declares (tests/test_conventions.py). Importable by name, so they run in the isolated worker."""
import torch
import torch.nn.functional as F


def _rms(h: torch.Tensor, normalized_shape, eps):
    dims = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    return h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)


def llama_rms_norm(input, normalized_shape, weight, eps):
    """Llama-style: float32 compute, x̂ rounded to the input dtype, then times the weight (so y is promoted
    with the weight's dtype). Follows casting=before-weight, output_dtype=promote, compute_dtype=f32."""
    x_hat = _rms(input.to(torch.float32), normalized_shape, eps).to(input.dtype)
    return x_hat if weight is None else weight * x_hat


def llama_rms_norm_off_by_a_little(input, normalized_shape, weight, eps):
    """llama_rms_norm with y 0.1 % too large: a wrong value, in the dtype the layer declares."""
    return llama_rms_norm(input, normalized_shape, weight, eps) * 1.001


def _fp32_layer_norm(input, normalized_shape, weight, bias, eps):
    up = [None if t is None else t.float() for t in (weight, bias)]
    return F.layer_norm(input.float(), normalized_shape, *up, eps)


def fp32_layer_norm(input, normalized_shape, weight, bias, eps):
    """An fp32 LayerNorm: everything upcast to float32, the result cast back to the input dtype (float64 input
    included). Follows compute_dtype=f32."""
    return _fp32_layer_norm(input, normalized_shape, weight, bias, eps).to(input.dtype)


def promoting_layer_norm(input, normalized_shape, weight, bias, eps):
    """The fp32 LayerNorm returning result_type over x and every parameter it is given (f32 for bf16 input with an
    f32 weight or bias: a bias-only layer's included). Follows compute_dtype=f32, output_dtype=promote."""
    return _fp32_layer_norm(input, normalized_shape, weight, bias, eps).to(_promoted(input, weight, bias))


def _promoted(input, *params):
    """result_type over x and every parameter given (output_dtype=promote)."""
    dtype = input.dtype
    for t in params:
        dtype = dtype if t is None else torch.promote_types(dtype, t.dtype)
    return dtype


def _per_channel(t, x, k: int):
    """γ or β (shaped like the normalised dims 1..k) broadcastable against channels-first x."""
    return None if t is None else t.reshape(t.shape + (1,) * (x.dim() - 1 - k))


def convnext_layer_norm(input, normalized_shape, weight, bias, eps):
    """ConvNeXt's channels-first LayerNorm, written out (statistics over dims 1..K of (N, C, ...) input), computed in
    float32 for half input and returned as result_type over x and its parameters. Follows normalized_at=channels,
    output_dtype=promote."""
    k = len(normalized_shape)
    dims = tuple(range(1, 1 + k))
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    u = x.mean(dims, keepdim=True)
    s = (x - u).pow(2).mean(dims, keepdim=True)
    y = (x - u) / torch.sqrt(s + eps)
    w, b = _per_channel(weight, input, k), _per_channel(bias, input, k)
    y = y if w is None else w * y
    y = y if b is None else y + b
    return y.to(_promoted(input, weight, bias))


def layer_norm_2d(input, normalized_shape, weight, bias, eps):
    """ViTDet's and detectron2's LayerNorm2d: the normalised dims moved last, F.layer_norm, moved back (torch's
    kernel then sees a non-contiguous tensor). Follows normalized_at=channels."""
    k = len(normalized_shape)
    moved = input.movedim(tuple(range(1, 1 + k)), tuple(range(-k, 0)))
    return F.layer_norm(moved, normalized_shape, weight, bias, eps).movedim(tuple(range(-k, 0)), tuple(range(1, 1 + k)))


def channels_first_rms_norm(input, normalized_shape, weight, eps):
    """RMSNorm over dims 1..K of (N, C, ...) input in float32 (for half input), as diffusion models' RMSNorm2d;
    y in the input dtype. Follows normalized_at=channels."""
    k = len(normalized_shape)
    x = input.to(torch.promote_types(input.dtype, torch.float32))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x * torch.rsqrt(x.pow(2).mean(tuple(range(1, 1 + k)), keepdim=True) + eps)
    w = _per_channel(weight, input, k)
    return (y if w is None else y * w).to(input.dtype)


# --------------------------------------------------------------------------- RMSNorm casting chains
def _upcast(t):
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _rounded(t, dtype):
    """t rounded to `dtype` in the forward, its gradient passed straight through in t's own precision (where t or
    its rounding is inf the forward is the rounding itself: t + (inf − t) would be NaN)."""
    finite = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    return t.detach().to(dtype).to(t.dtype) + (finite - finite.detach())


def _rstd(h, normalized_shape, eps):
    eps = torch.finfo(h.dtype).eps if eps is None else eps
    return torch.rsqrt(h.pow(2).mean(tuple(range(-len(normalized_shape), 0)), keepdim=True) + eps)


def rms_end(input, normalized_shape, weight, eps):
    """Everything in float32, rounded once at the end (casting=end)."""
    h = _upcast(input)
    y = h * _rstd(h, normalized_shape, eps)
    return (y if weight is None else y * _upcast(weight)).to(input.dtype)


def rms_before_weight(input, normalized_shape, weight, eps):
    """x̂ rounded to the input dtype, then times the weight (casting=before-weight)."""
    h = _upcast(input)
    y = (h * _rstd(h, normalized_shape, eps)).to(input.dtype)
    return (y if weight is None else y * weight).to(input.dtype)


def rms_rstd_input(input, normalized_shape, weight, eps):
    """rstd rounded to the input dtype, x · rstd rounded there, then times the weight (casting=rstd-input); the
    roundings pass gradients straight through in float32 (an f16 rstd in the graph would sum its gradient in f16)."""
    h = _upcast(input)
    y = _rounded(h * _rounded(_rstd(h, normalized_shape, eps), input.dtype), input.dtype)
    return (y if weight is None else y * _upcast(weight)).to(input.dtype)


def t5_rms_norm(input, normalized_shape, weight, eps):
    """T5-style: x̂ rounded to the weight's dtype when that is f16/bf16 (otherwise not rounded), weight · x̂, so y
    is promoted with the weight. Within y's own rounding this is casting=end with output_dtype=promote."""
    h = _upcast(input)
    y = h * _rstd(h, normalized_shape, eps)
    if weight is None:
        return y.to(input.dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        y = y.to(weight.dtype)
    return weight * y


def gemma_rms_norm(input, normalized_shape, weight, eps):
    """Gemma-style: a zero-centred weight, the layer scales by 1 + w formed in float32 (weight_offset=1)."""
    h = _upcast(input)
    y = h * _rstd(h, normalized_shape, eps)
    return (y if weight is None else y * (1.0 + _upcast(weight))).to(input.dtype)
