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
    """The fp32 LayerNorm returning result_type(x, weight) (f32 for bf16 input with f32 weight). Follows
    compute_dtype=f32, output_dtype=promote."""
    out = _fp32_layer_norm(input, normalized_shape, weight, bias, eps)
    return out.to(input.dtype if weight is None else torch.result_type(input, weight))
