"""Speech-tokenizer decoder (codes -> 24 kHz waveform), pure torch.

Module paths equal the checkpoint keys under ``decoder.`` in ``speech_tokenizer/model.safetensors``.
Pipeline for codes ``[B, 16, T]``:

1. RVQ decode: codebook rows ``embedding_sum / clamp(cluster_usage, 1e-5)``; codebook 0 ("first")
   and codebooks 1..15 ("rest", summed) each pass their own 1x1 ``output_proj``; the two are added.
2. ``pre_conv`` (causal k3) -> ``pre_transformer`` (8 layers, sliding window 72 incl. self,
   RoPE theta 1e4, LayerScale) -> two x2 upsamplers (transposed conv + ConvNeXt).
3. ``decoder``: causal conv k7, four SnakeBeta/transposed-conv/residual blocks (x8 x5 x4 x3),
   SnakeBeta, causal conv k7 -> 1 channel, clamp to [-1, 1].

Every convolution is causal (left zero padding), which is what makes the stateful streaming
step in :mod:`qtts.model.vocoder_step` exact. The helpers here (``attend``, ``SnakeBeta.coefficients``)
and the Qwen3 primitives of :mod:`qtts.model.layers` (RMSNorm, MLP, RoPE) are shared with that step
so both compute the same function.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig
from .layers import MLP, Attention, LayerScale, RMSNorm, fp32, rope_angles, rope_inv_freq

CODEBOOK_EPS = 1e-5
SNAKE_EPS = 1e-9


# ----------------------------------------------------------------------------- quantizer
class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        """[size, dim] codebook vectors."""
        return self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]


class VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(VectorQuantization(size, dim) for _ in range(n))


class ResidualVectorQuantizer(nn.Module):
    """``n`` codebooks summed in the ``dim`` space, then a 1x1 ``output_proj`` (no bias)."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoder side; unused when decoding
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _Layers(n, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, n, T] -> [B, io_dim, T]."""
        total = 0
        for k, layer in enumerate(self.vq.layers):
            total = total + F.embedding(codes[:, k], layer._codebook.table()).transpose(1, 2)
        return self.output_proj(total)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        n_first = cfg.num_semantic_quantizers
        dim = cfg.codebook_dim // 2
        self.n_first = n_first
        self.rvq_first = ResidualVectorQuantizer(n_first, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualVectorQuantizer(
            cfg.num_quantizers - n_first, cfg.codebook_size, dim, cfg.codebook_dim
        )

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] int64 -> [B, codebook_dim, T]."""
        first = self.rvq_first.decode(codes[:, : self.n_first])
        return first + self.rvq_rest.decode(codes[:, self.n_first :])


# ----------------------------------------------------------------------------- convolutions
class CausalConv(nn.Module):
    """Conv1d with (k-1)*dilation zeros of left padding (stride 1)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation  # input frames of history one output needs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.context, 0)))


class CausalConvTranspose(nn.Module):
    """ConvTranspose1d(k, stride s) whose last k-s output samples are dropped: T in -> T*s out."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.trim = kernel - stride  # (T-1)*s + k outputs, the last k-s dropped
        # input frames of history an output block needs: outputs of frame t get overlap from t-1..
        self.context = (kernel - 1) // stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : -self.trim] if self.trim else y


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def mix(self, h: torch.Tensor) -> torch.Tensor:
        """Channel MLP after the depthwise conv: [B, C, T] -> [B, C, T]."""
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return (self.gamma * h).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(self.dwconv(x))


class SnakeBeta(nn.Module):
    """y = x + sin(x * e^alpha)^2 / (e^beta + 1e-9); alpha, beta are per-channel logs."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, inv_b) as [1, C, 1]: the exp()s folded, for graphs that must not contain Exp."""
        a = torch.exp(self.alpha)[None, :, None]
        inv_b = 1.0 / (torch.exp(self.beta)[None, :, None] + SNAKE_EPS)
        return a, inv_b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, inv_b = self.coefficients()
        return snake(x, a, inv_b)


def snake(x: torch.Tensor, a: torch.Tensor, inv_b: torch.Tensor) -> torch.Tensor:
    s = torch.sin(x * a)
    return x + inv_b * (s * s)  # s*s, not pow: QNN HTP computes pow(-0.0, 2) as -4


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


RESIDUAL_DILATIONS = (1, 3, 9)


class DecoderBlock(nn.Module):
    """SnakeBeta -> causal transposed conv (k=2r, stride r) -> three residual units."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units = [ResidualUnit(cout, d) for d in RESIDUAL_DILATIONS]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalConvTranspose(cin, cout, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x


# ----------------------------------------------------------------------------- transformer
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Softmax attention with an additive bias; q [B, nh, Tq, hd], k/v [B, nkv, Tk, hd] -> [B, Tq, nh*hd]."""
    b, nh, tq, hd = (int(d) for d in q.shape)  # python ints: no Shape/Pow nodes when traced
    rep = nh // int(k.shape[1])
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * float(hd**-0.5) + bias
    probs = torch.softmax(fp32(scores), dim=-1)
    out = torch.matmul(probs if q.dtype == torch.float32 else probs.to(q.dtype), v)
    return out.transpose(1, 2).reshape(b, tq, nh * hd)


class TransformerLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def finish(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual adds after attention (attn_out is before o_proj), then the MLP branch."""
        x = x + self.self_attn_layer_scale(self.self_attn.o_proj(attn_out))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.head_dim, self.theta, self.window = cfg.head_dim, cfg.rope_theta, cfg.sliding_window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, latent] -> [B, T, latent]; positions 0..T-1, sliding-window causal mask."""
        t = x.shape[1]
        angles = rope_angles(torch.arange(t, device=x.device), rope_inv_freq(self.head_dim, self.theta, x.device))
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        i = torch.arange(t, device=x.device)
        rel = i[:, None] - i[None, :]  # query - key
        visible = (rel >= 0) & (rel < self.window)  # key j visible to query i iff i-window < j <= i
        bias = torch.zeros(t, t, dtype=x.dtype, device=x.device)
        bias = bias.masked_fill(~visible, torch.finfo(x.dtype).min)
        h = self.input_proj(x)
        for layer in self.layers:
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(h), cos, sin)
            h = layer.finish(h, attend(q, k, v, bias))
        return self.output_proj(self.norm(h))


# ----------------------------------------------------------------------------- decoder
class Decoder(nn.Module):
    """Speech-tokenizer decoder; ``forward(codes [B,16,T]) -> wav [B,1,T*1920]`` (offline decode)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitResidualVectorQuantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [CausalConvTranspose(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)]
            )
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        blocks = [CausalConv(cfg.latent_dim, dims[0], 7)]
        blocks += [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
        blocks += [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        self.decoder = nn.ModuleList(blocks)

    @property
    def samples_per_frame(self) -> int:
        return int(math.prod(list(self.config.upsample_rates) + list(self.config.upsampling_ratios)))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] int64 (negative = padding, clamped to 0) -> [B, 1, T*1920] in [-1, 1]."""
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be [B, {self.config.num_quantizers}, T], got {tuple(codes.shape)}")
        h = self.pre_conv(self.quantizer.decode(codes.clamp(min=0)))  # [B, latent, T]
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        for convt, block in self.upsample:
            h = block(convt(h))
        for m in self.decoder:
            h = m(h)
        return h.clamp(min=-1.0, max=1.0)
