"""Normalization layers as model libraries write them: `nn.Module` classes with their own constructors, parameter
names and conventions, given to normcheck by class (`--impl tests._layer_classes:LlamaStyleRMSNorm`) with no adapter
code. Each comment says what a run declares for it; the `Broken...` ones carry one real deviation each.
Importable by name, so they run in the isolated worker."""
import numbers

import torch
import torch.nn.functional as F
from torch import nn


class LlamaStyleRMSNorm(nn.Module):
    """A Llama-style RMSNorm: `weight` and `variance_epsilon`, float32 statistics, x̂ rounded to the input dtype
    before the weight multiplies it. Declares --casting before-weight --output-dtype promote --compute-dtype f32."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class BrokenHalfStatisticsRMSNorm(LlamaStyleRMSNorm):
    """The Llama-style layer with its mean of squares taken in the input dtype (half sums in half precision)."""

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        rstd = torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * (hidden_states.to(torch.float32) * rstd.to(torch.float32)).to(dtype)


class GemmaStyleRMSNorm(nn.Module):
    """Gemma-style: a zero-initialised `weight`, the layer scales by 1 + w formed in float32, y in the input dtype.
    Declares --weight-offset 1 --compute-dtype f32."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        h = x.float()
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class BrokenGemmaStyleRMSNorm(GemmaStyleRMSNorm):
    """The Gemma-style layer with its zero-centred weight held in bfloat16: 1 + w loses w's low bits where it is
    near 0 (u_bf16·|w|, 2^16 times float32's rounding of w)."""

    def forward(self, x):
        h = x.float()
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.bfloat16().float())).type_as(x)


class ChannelsFirstLayerNorm(nn.Module):
    """A LayerNorm2d as vision libraries write it: statistics over the channels of (N, C, H, W) input, the channels
    moved last for F.layer_norm and back. Declares --normalized-at channels."""

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_channels)) if affine else None

    def forward(self, x):
        x = x.movedim(1, -1)
        x = F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        return x.movedim(-1, 1)


class BrokenLastDimLayerNorm(ChannelsFirstLayerNorm):
    """The channels-first LayerNorm normalising the last dim instead (a stride read wrongly, in effect)."""

    def forward(self, x):
        y = F.layer_norm(x, (x.shape[-1],), None, None, self.eps)
        shape = (-1,) + (1,) * (x.dim() - 2)
        return y if self.weight is None else y * self.weight.reshape(shape) + self.bias.reshape(shape)


class FrozenBatchNorm2d(nn.Module):
    """A frozen BatchNorm as detection libraries write it: weight, bias and the running statistics are buffers, the
    layer always normalises with the running statistics and computes in their dtype. Declares --mode eval
    --output-dtype promote (y comes back in result_type(x, its float32 buffers))."""

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x):
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


class BrokenFrozenBatchNorm2d(FrozenBatchNorm2d):
    """The frozen BatchNorm with eps added outside the square root."""

    def forward(self, x):
        scale = self.weight * (self.running_var.rsqrt() + self.eps)
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


class UnsqueezedFrozenBatchNorm2d(FrozenBatchNorm2d):
    """The frozen BatchNorm broadcasting by dims added one call at a time (scale.unsqueeze(-1).unsqueeze(-1)): written
    for 4-D input, which no shape in its source says; on (N, C) input it broadcasts to (C, N, C)."""

    def forward(self, x):
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.unsqueeze(-1).unsqueeze(-1) + shift.unsqueeze(-1).unsqueeze(-1)


class ReassigningBatchNorm(nn.Module):
    """A BatchNorm written out that reassigns its running statistics (self.running_mean = ...) instead of updating
    them in place, and names them `moving_mean`/`moving_var` as some ports do."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("moving_mean", torch.zeros(num_features))
        self.register_buffer("moving_var", torch.ones(num_features))

    def forward(self, x):
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, -1] + [1] * (x.dim() - 2)
        if self.training:
            mean, var = x.mean(dims), x.var(dims, unbiased=False)
            n = x.numel() // x.shape[1]
            with torch.no_grad():
                self.moving_mean = (1 - self.momentum) * self.moving_mean + self.momentum * mean
                self.moving_var = (1 - self.momentum) * self.moving_var + self.momentum * var * n / (n - 1)
        else:
            mean, var = self.moving_mean, self.moving_var
        y = (x - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + self.eps)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)


class AddRMSNorm(nn.Module):
    """A fused-style residual add + RMSNorm module: forward(x, residual) -> (y, h), h = x + residual in x's dtype,
    statistics in float32, y in x's dtype."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x, residual):
        h = x + residual
        f = h.float()
        y = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype), h


class ConfiguredNorm(nn.Module):
    """A layer whose constructor takes a config object (as model libraries' layers often do): normcheck cannot fill
    `config`, so it is given through a factory (make_configured_norm)."""

    def __init__(self, config):
        super().__init__()
        self.norm = nn.LayerNorm(config["hidden"], eps=config["eps"])

    def forward(self, x):
        return self.norm(x)


def make_configured_norm(hidden_size: int, eps: float) -> nn.Module:
    """A factory: the sizes and eps in, the configured layer out."""
    return ConfiguredNorm({"hidden": hidden_size, "eps": eps})


class FixedEpsLayerNorm(nn.Module):
    """A LayerNorm whose eps is fixed (no constructor argument): cases with another eps are not its to take."""

    def __init__(self, normalized_shape):
        super().__init__()
        self.eps = 1e-5
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class Float32LayerNorm(nn.LayerNorm):
    """diffusers' FP32LayerNorm: F.layer_norm on x, γ and β taken to float32 (a float64 x too), y back in x's dtype.
    Declares --compute-dtype f32."""

    def forward(self, inputs):
        return F.layer_norm(inputs.float(), self.normalized_shape, None if self.weight is None else self.weight.float(),
                            None if self.bias is None else self.bias.float(), self.eps).to(inputs.dtype)


class BrokenGradientFloat32LayerNorm(Float32LayerNorm):
    """The float32 LayerNorm with its input gradient tripled (x + 2·(x − x.detach()): the same y)."""

    def forward(self, inputs):
        return super().forward(inputs + 2 * (inputs - inputs.detach()))


# A module already built (its sizes fixed), given where its class is meant: a usage line naming the class
BUILT_LAYER_NORM = nn.LayerNorm(8)


class AnnotatedTransformerLayerNorm(nn.Module):
    """The annotated transformer's LayerNorm, as the tutorial writes it (its parameters named a_2 and b_2)."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


# -- gated and grouped norms (issue 62) ------------------------------------------------------------------------------
class GroupedGatedRMSNorm(nn.Module):
    """A gated RMSNorm as state-space blocks write it (Mamba2's RMSNormGated): `group_size` cuts the row into groups
    with a statistic each, the gate `z` is applied before the norm or after it (`norm_before_gate`), statistics in
    float32, y in x's dtype; no bias (a parameter slot left empty)."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def _groups(self, h):
        size = self.group_size or h.shape[-1]
        return h.unflatten(-1, (-1, size))

    def forward(self, x, z=None):
        dtype, h = x.dtype, x.float()
        gate = None if z is None else F.silu(z.float())
        if gate is not None and not self.norm_before_gate:
            h = h * gate
        grouped = self._groups(h)
        h = self._ungrouped(grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps))
        h = h * self.weight.float()
        if gate is not None and self.norm_before_gate:
            h = h * gate
        return h.to(dtype)

    def _ungrouped(self, grouped):
        return grouped.flatten(-2)


class BrokenGroupedGatedRMSNorm(GroupedGatedRMSNorm):
    """The gated RMSNorm with its groups taken strided across the row (every G-th value) instead of consecutive."""

    def _groups(self, h):
        size = self.group_size or h.shape[-1]
        return h.unflatten(-1, (size, -1)).transpose(-1, -2)

    def _ungrouped(self, grouped):
        return grouped.transpose(-1, -2).flatten(-2)


class RequiredGroupsGatedRMSNorm(nn.Module):
    """A gated RMSNorm whose constructor requires its group size (transformers' Mamba2 port: no default), the gate
    before the norm, Llama's casting. Where a case has no groups, the whole row is its one group. Declares
    --casting before-weight --output-dtype promote --compute-dtype f32."""

    def __init__(self, hidden_size, group_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.group_size, self.eps = group_size, eps

    def forward(self, hidden_states, gate=None):
        dtype, h = hidden_states.dtype, hidden_states.float()
        if gate is not None:
            h = h * F.silu(gate.float())
        groups = h.unflatten(-1, (-1, self.group_size))
        h = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return self.weight * h.to(dtype)


class GateFirstRMSNorm(nn.Module):
    """A gated RMSNorm as transformers' Mamba2 port writes it: forward(hidden_states, gate=None), the gate applied
    before the norm, Llama's casting (x̂ in x's dtype before the weight)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states, gate=None):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        if gate is not None:
            h = h * F.silu(gate.to(torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


def make_grouped_rms_norm(hidden_size, eps, group_size=None):
    """A factory that requires eps (it raised on every row while eps never reached it)."""
    return GroupedGatedRMSNorm(hidden_size, eps=eps, group_size=group_size)


# -- a norm conditioned through a projection (issue 62) --------------------------------------------------------------
class ConditionedLayerNorm(nn.Module):
    """An adaptive LayerNorm as diffusion models write it (diffusers' AdaLayerNorm): a conditioning embedding `temb`
    goes through SiLU and a Linear(D, 2D) to a scale and a shift; the norm itself has no parameters."""

    def __init__(self, embedding_dim, num_embeddings=None, output_dim=None, norm_elementwise_affine=False,
                 norm_eps=1e-5):
        super().__init__()
        output_dim = output_dim or embedding_dim * 2
        self.emb = nn.Embedding(num_embeddings, embedding_dim) if num_embeddings is not None else None
        self.linear = nn.Linear(embedding_dim, output_dim)
        self.norm = nn.LayerNorm(output_dim // 2, norm_eps, norm_elementwise_affine)

    def forward(self, x, timestep=None, temb=None):
        if self.emb is not None:
            temb = self.emb(timestep)
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=-1)
        return self.norm(x) * (1 + scale) + shift


def make_conditioned_layer_norm(embedding_dim):
    """The same layer from a factory: its projection is seen on the module it returns."""
    return ConditionedLayerNorm(embedding_dim)


class PermutedLayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: channels-first by permuting (N, C, H, W) to channels-last and back around F.layer_norm, so
    written for 4-D input (x.permute(0, 2, 3, 1)); right under --normalized-at channels."""

    def __init__(self, num_channels, eps=1e-6, affine=True, **kwargs):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine, **kwargs)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class BrokenBiasGradientLayerNorm2d(PermutedLayerNorm2d):
    """timm's LayerNorm2d with its bias gradient tripled (β + 2·(β − β.detach()), added in x's dtype: the same y, of
    the same dtype with float32 parameters too)."""

    def forward(self, x):
        return super().forward(x) + (2 * (self.bias - self.bias.detach())).to(x.dtype)[:, None, None]


# -- size arguments: one int or a shape (issue 62) -------------------------------------------------------------------
class ChannelsFirstOneSizeLayerNorm(nn.Module):
    """A channels-first LayerNorm as detection backbones write it (ViTDet's): `normalized_shape` is one int, the
    statistics over dim 1 of (N, C, H, W), the weight broadcast as weight[:, None, None]. Declares --normalized-at
    channels."""

    def __init__(self, normalized_shape, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.normalized_shape = (normalized_shape,)

    def forward(self, x):
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        spread = (slice(None),) + (None,) * (x.dim() - 2)
        return self.weight[spread] * x + self.bias[spread]


class LastDimOneSizeLayerNorm(nn.Module):
    """ConvNeXt's LayerNorm in its channels-last form: `normalized_shape` one int, kept as a 1-tuple for
    F.layer_norm."""

    def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps, self.data_format = eps, data_format
        self.normalized_shape = (normalized_shape, )

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class ChannelsNamedLayerNorm(nn.LayerNorm):
    """A LayerNorm subclass whose size is named `num_channels` and handed to nn.LayerNorm's normalized_shape (timm's
    LayerNorm): a shape under another name."""

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)


class ShapeAnnotatedRMSNorm(nn.Module):
    """An RMSNorm whose `dim` is annotated to take a shape: its weight is shaped so, its statistics over as many
    trailing dims."""

    def __init__(self, dim: int | tuple[int, ...], eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class SingleGroupNorm(nn.GroupNorm):
    """timm's GroupNorm1: one group, every other argument (eps, affine) passed through **kwargs to nn.GroupNorm."""

    def __init__(self, num_channels, **kwargs):
        super().__init__(1, num_channels, **kwargs)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


def make_group_norm32(in_channels):
    """A factory with a fixed group count and eps (Flux's autoencoder `Normalize`)."""
    return nn.GroupNorm(num_groups=32, num_channels=in_channels, eps=1e-6, affine=True)


# -- eps written in forward (issue 62) -------------------------------------------------------------------------------
class LiteralEpsRMSNorm(nn.Module):
    """An RMSNorm with its eps a literal in forward (Flux's): the weight named `scale`, statistics in float32, x̂
    rounded to x's dtype before the weight."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        rrms = torch.rsqrt(torch.mean(h ** 2, dim=-1, keepdim=True) + 1e-6)
        return (h * rrms).to(dtype=dtype) * self.scale


class LiteralEpsLayerNorm(nn.Module):
    """A LayerNorm without parameters whose eps is a keyword literal in forward (OLMo's)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.normalized_shape = (hidden_size,)

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        return F.layer_norm(hidden_states.to(torch.float32), self.normalized_shape, None, None, eps=1e-5).to(dtype)


class LiteralEpsFrozenBatchNorm2d(nn.Module):
    """A frozen BatchNorm with eps assigned in forward (DETR's). Declares --mode eval --output-dtype promote."""

    def __init__(self, n):
        super().__init__()
        for name, value in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
            self.register_buffer(name, torch.full((n,), value))

    def forward(self, x):
        eps = 1e-5
        scale = self.weight.reshape(1, -1, 1, 1) * (self.running_var.reshape(1, -1, 1, 1) + eps).rsqrt()
        return x * scale + (self.bias.reshape(1, -1, 1, 1) - self.running_mean.reshape(1, -1, 1, 1) * scale)


# -- a scalar gain (issue 62) ----------------------------------------------------------------------------------------
class ScalarGainScaleNorm(nn.Module):
    """ScaleNorm as its paper writes it: one learned scalar g, a 0-d parameter initialised to √dim, y = g·x/max(‖x‖,
    eps)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.g = nn.Parameter(torch.tensor(dim ** 0.5))
        self.eps = eps

    def forward(self, x):
        return x * (self.g / torch.norm(x, dim=-1, keepdim=True).clamp(min=self.eps))


class TimmStyleBatchNorm2d(nn.BatchNorm2d):
    """A BatchNorm subclass as timm writes its BatchNormAct2d (the activation left out): its own forward, which calls
    F.batch_norm with the statistics it picks. torch's kernel's known issues are its own where torch's record fails
    the case alike."""

    def forward(self, x):
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        training = self.training or (self.running_mean is None and self.running_var is None)
        return F.batch_norm(x, self.running_mean if not self.training or self.track_running_stats else None,
                            self.running_var if not self.training or self.track_running_stats else None,
                            self.weight, self.bias, training, factor, self.eps)


class BrokenGradientBatchNorm2d(TimmStyleBatchNorm2d):
    """The timm-style subclass scaling the gradient that reaches F.batch_norm by 10: dx, dweight and dbias wrong where
    torch's kernel is wrong too, but far more than torch's are (a failure within 4 times torch's own ratio there is
    comparable: engine.compare.COMPARABLE)."""

    def forward(self, x):
        y = super().forward(x)
        if y.requires_grad:
            y.register_hook(lambda g: g * 10)
        return y


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., 2025) in place of a LayerNorm: γ·tanh(αx) + β, no statistic at all. None of
    normcheck's ops describes it."""

    def __init__(self, normalized_shape, alpha_init_value=0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        return self.weight * torch.tanh(self.alpha * x) + self.bias


class TimmSimpleNorm(nn.Module):
    """timm's SimpleNorm (timm.layers.norm) as it writes it, x / std(x): x · rsqrt(var(x) + eps) · w over the last
    dim, var torch.var's default (unbiased), x itself not centred. The op simplenorm's; run as rmsnorm, another op's."""

    def __init__(self, channels, eps=1e-6, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels)) if affine else None

    def forward(self, x):
        x = x * torch.rsqrt(torch.var(x, dim=-1, keepdim=True) + self.eps)
        return x if self.weight is None else x * self.weight


# -- F.normalize and ScaleNorm's √d (issue 62) ----------------------------------------------------------------------
class NormalizeRMSNorm(nn.Module):
    """RMSNorm as lucidrains writes it in many repositories: F.normalize (its own eps, 1e-12, kept) times √dim and a
    per-element gain; no eps of its own. Judged as the op rmsnorm_l2."""

    def __init__(self, dim):
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class BrokenNormalizeRMSNorm(NormalizeRMSNorm):
    """Its twin without the √dim: x̂ of norm 1, not RMS 1."""

    def forward(self, x):
        return F.normalize(x, dim=-1) * self.gamma


class UnitOffsetRMSNorm(nn.Module):
    """x-transformers' RMSNorm with unit_offset: the gain stored as g = 0 at initialisation, scaled by g + 1.
    Declares --weight-offset 1."""

    def __init__(self, dim, unit_offset=True):
        super().__init__()
        self.unit_offset = unit_offset
        self.scale = dim ** 0.5
        self.g = nn.Parameter(torch.zeros(dim))
        nn.init.constant_(self.g, 1.0 - float(unit_offset))

    def forward(self, x):
        gamma = self.g + float(self.unit_offset)
        return F.normalize(x, dim=-1) * self.scale * gamma


class NormalizeScaleNorm(UnitOffsetRMSNorm):
    """x-transformers' ScaleNorm: one scalar gain, F.normalize(x)·√dim·(g + offset). Declares --eps-at normalize."""

    def __init__(self, dim, unit_offset=False):
        super().__init__(dim, unit_offset)
        self.g = nn.Parameter(torch.full((1,), 1.0 - float(unit_offset)))


class RMSFloorScaleNorm(nn.Module):
    """mmpose's ScaleNorm: the norm times dim^(−1/2) (the RMS) floored at eps, one scalar gain. Declares --eps-at rms."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.scale = dim ** -0.5
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1))

    def forward(self, x):
        rms = torch.norm(x, dim=-1, keepdim=True) * self.scale
        return x / rms.clamp(min=self.eps) * self.g


class BrokenRMSFloorScaleNorm(RMSFloorScaleNorm):
    """Its twin flooring the norm before the scale (‖x‖.clamp(eps)·dim^(−1/2)): a floor √dim times too low."""

    def forward(self, x):
        rms = torch.norm(x, dim=-1, keepdim=True).clamp(min=self.eps) * self.scale
        return x / rms * self.g


# -- what a forward writes: the dims it reduces over, a default eps, a broadcast shape (issue 62) ---------------------
class TrailingDimRMSNorm(nn.Module):
    """An RMSNorm as diffusion libraries write it (diffusers' RMSNorm, MochiRMSNorm): `dim` one int or a shape (its
    weight is torch.ones(dim)), but the mean of squares over the last dim only, in float32, y in x's dtype. It
    normalises one dim. Declares --compute-dtype f32 --output-dtype promote."""

    def __init__(self, dim, eps: float, elementwise_affine: bool = True):
        super().__init__()
        self.eps = eps
        if isinstance(dim, numbers.Integral):
            dim = (dim,)
        self.dim = torch.Size(dim)
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        if self.weight is not None:
            hidden_states = hidden_states * self.weight
        return hidden_states.to(input_dtype)


class FlattenedTrailingDimsRMSNorm(TrailingDimRMSNorm):
    """Its twin that flattens the dims of its shape before the mean over the last one: it normalises them all."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32).flatten(-len(self.dim))
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).unflatten(-1, self.dim)
        if self.weight is not None:
            h = h * self.weight
        return h.to(input_dtype)


class EpsNormalizeRMSNorm(NormalizeRMSNorm):
    """lucidrains' RMSNorm passing F.normalize an eps of its constructor's: it takes the case's."""

    def __init__(self, dim, eps=1e-12):
        super().__init__(dim)
        self.eps = eps

    def forward(self, x):
        return F.normalize(x, dim=-1, eps=self.eps) * self.scale * self.gamma


# -- a layer that writes its input: x handed over as a network hands it (issue 62) ----------------------------------
class InPlaceLayerNorm(nn.Module):
    """A LayerNorm that overwrites its input with y and returns it, as memory-saving layers do (InPlaceABN, in-place
    activations): x centred, scaled and shifted in place. Its variance is taken of a copy of the centred x: x.square()
    would keep x for its backward, which the next write overwrites (autograd then refuses the backward)."""

    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        x.sub_(x.mean(-1, keepdim=True))
        variance = x.clone().square().mean(-1, keepdim=True)
        return x.div_((variance + self.eps).sqrt()).mul_(self.weight).add_(self.bias)


class CopyReturningInPlaceLayerNorm(InPlaceLayerNorm):
    """Its twin returning y in memory of its own: the right values, and its caller's x overwritten for nothing it
    returns (a residual stream read afterwards finds it changed)."""

    def forward(self, x):
        return super().forward(x).clone()


# -- a forward that calls module-level helpers (issue 62) -------------------------------------------------------------
FUSED_RMS_NORM = None  # (a fused channels-last kernel where one is installed: apex's, for timm)


def rms_norm2d(v, normalized_shape, weight=None, eps=1e-5):
    """timm's rms_norm2d: the mean of squares over dim 1 of (N, C, H, W), the weight broadcast to it."""
    assert len(normalized_shape) == 1
    v = v * torch.rsqrt(torch.mean(v.pow(2), dim=1, keepdim=True) + eps)
    return v if weight is None else v * weight.reshape(1, -1, 1, 1)


def fast_rms_norm2d(x, normalized_shape, weight=None, eps=1e-5):
    """timm's fast path: the fused kernel on the channels-last view, else rms_norm2d."""
    if FUSED_RMS_NORM is not None:
        return FUSED_RMS_NORM(x.permute(0, 2, 3, 1), normalized_shape, weight, eps).permute(0, 3, 1, 2)
    return rms_norm2d(x, normalized_shape, weight, eps)


class HelperRmsNorm2d(nn.Module):
    """timm's RmsNorm2d: a channels-first RMSNorm whose forward is module-level functions, a fast path and its
    fallback, both written for 4-D input. Declares --normalized-at channels."""

    def __init__(self, channels, eps=1e-6, affine=True):
        super().__init__()
        self.normalized_shape, self.eps, self._fast_norm = (channels,), eps, False
        self.weight = nn.Parameter(torch.ones(channels)) if affine else None

    def forward(self, x):
        if self._fast_norm:
            return fast_rms_norm2d(x, self.normalized_shape, self.weight, self.eps)
        return rms_norm2d(x, self.normalized_shape, self.weight, self.eps)


def rms_over(x, dim, eps):
    """A generic helper: the RMS norm over the dims it is given."""
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + eps)


def broadcast_3d(w):
    """A channels weight shaped for (N, C, L) input."""
    return w.view(1, -1, 1)


class GenericHelperRMSNorm(LlamaStyleRMSNorm):
    """An RMSNorm whose helper takes the dim it reduces over: the helper writes no dim of its own."""

    def forward(self, hidden_states):
        return self.weight * rms_over(hidden_states, -1, self.variance_epsilon)


class DisagreeingHelpersRmsNorm2d(HelperRmsNorm2d):
    """Its fast path written for 4-D input, its fallback's weight for 3-D: which runs is not in the source."""

    def forward(self, x):
        if self._fast_norm:
            return fast_rms_norm2d(x, self.normalized_shape, self.weight, self.eps)
        return x * broadcast_3d(self.weight)
