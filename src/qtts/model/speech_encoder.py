"""Speech-tokenizer encoder (Mimi): 24 kHz audio -> 16 codebooks at 12.5 Hz, pure torch.

Module paths equal the checkpoint keys under ``encoder.`` of ``speech_tokenizer/model.safetensors``:
``encoder.layers.N`` (SEANet), ``encoder_transformer.layers.N``, ``downsample.conv``,
``quantizer.{semantic,acoustic}_residual_vector_quantizer.{input_proj,output_proj,layers.N.codebook.*}``.

Numerics follow the official path (transformers 4.57.3 ``MimiModel.encode`` as wrapped by
``Qwen3TTSTokenizerV2Model.encode``):

* Causal convs pad ``k_eff - stride`` on the left and an "extra" right pad that makes the length a
  multiple of the stride (``ceil(L/s)*s - L``); SEANet convs pad with zeros, ``downsample`` replicates.
  So ``frames == ceil(samples / 1920)``. (We pad a static ``stride - 1``: same outputs, see
  :class:`CausalConv`.)
* The transformer is plain causal: transformers' non-streaming Mimi encode does **not** apply
  ``sliding_window`` (250), so neither do we.
* Codebook = ``embed_sum / cluster_usage.clamp(min=1e-5)``; nearest code by Euclidean distance computed
  like ``torch.cdist`` (matmul form), ``argmin`` keeps the first index on ties.
* The semantic and the acoustic RVQ both quantize the same downsampled embedding (each with its own
  ``input_proj``); we stop after ``valid_quantizers`` codes (the others never influence them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from .layers import Attention, LayerScale, rope_inv_freq

_CODEBOOK_EPS = 1e-5


class CausalConv(nn.Module):
    """Mimi conv: stride-aligned padding, then ``.conv`` (keys ``<name>.conv.weight/bias``)."""

    def __init__(
        self, cfg: EncoderConfig, c_in, c_out, kernel, stride=1, dilation=1, bias=True, pad_mode=None
    ):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.causal = cfg.use_causal_conv
        mode = pad_mode or cfg.pad_mode
        self.pad_mode = "constant" if mode in ("constant", "zero") else mode
        self.stride = stride
        self.padding_total = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Mimi pads "extra" = ceil(L/s)*s - L on the right so the last partial window is computed.
        # A static right pad of s-1 gives the same ceil(L/s) outputs with the same values (the
        # extra samples are zeros, or the replicated last sample, and windows never reach past
        # them), and it keeps exported graphs free of shape arithmetic.
        right = self.stride - 1
        if self.causal:
            left = self.padding_total
        else:
            left, right = self.padding_total - self.padding_total // 2, self.padding_total // 2 + right
        if left or right:
            x = F.pad(x, (left, right), mode=self.pad_mode)
        return self.conv(x)


class ResnetBlock(nn.Module):
    """SEANet residual unit: ``block`` = [ELU, conv k3, ELU, conv k1] (+ optional conv shortcut)."""

    def __init__(self, cfg: EncoderConfig, dim: int, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                CausalConv(cfg, dim, hidden, cfg.residual_kernel_size, dilation=dilation),
                nn.ELU(),
                CausalConv(cfg, hidden, dim, 1),
            ]
        )
        self.shortcut = CausalConv(cfg, dim, dim, 1) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return self.shortcut(x) + y


class SEANetEncoder(nn.Module):
    """conv k7 -> per ratio (residual blocks, ELU, strided conv k=2r) -> ELU -> conv k3 to hidden."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [CausalConv(cfg, cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * cfg.num_filters
            for j in range(cfg.num_residual_layers):
                layers.append(ResnetBlock(cfg, dim, cfg.dilation_growth_rate**j))
            layers += [nn.ELU(), CausalConv(cfg, dim, dim * 2, ratio * 2, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), CausalConv(cfg, scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MLP(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Causal self-attention (SDPA, the official kernel) over all positions of ``x [B, T, H]``."""
        a = self.self_attn
        q, k, v = a.qkv(x, cos, sin)
        if a.kv_heads != a.heads:
            k = k.repeat_interleave(a.heads // a.kv_heads, dim=1)
            v = v.repeat_interleave(a.heads // a.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, heads, T, hd]
        return a.o_proj(y.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))

    def forward(self, x, cos, sin):
        x = x + self.self_attn_layer_scale(self.attend(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.head_dim, self.theta = cfg.head_dim, float(cfg.rope_theta)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def rope(self, t: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, head_dim]`` in float32 (rotate-half layout), positions 0..T-1."""
        inv_freq = rope_inv_freq(self.head_dim, self.theta, device)
        pos = torch.arange(t, device=device, dtype=torch.float32)
        freqs = inv_freq[:, None] @ pos[None, :]  # [hd/2, T], as the official code computes it
        emb = torch.cat((freqs, freqs), dim=0).transpose(0, 1)
        return emb.cos(), emb.sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rope(x.shape[1], x.device)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """Euclidean codebook; the three buffers are checkpoint tensors (persistent)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def embed(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=_CODEBOOK_EPS)[:, None]


class VectorQuantization(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = Codebook(size, dim)


def nearest_code(x: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """Index of the nearest row of ``embed`` [K, D] for each row of ``x`` [N, D] (fp32).

    Same arithmetic as ``torch.cdist(p=2)``'s matmul path (used whenever K > 25):
    ``sqrt(clamp(|x|^2 - 2 x.e + |e|^2, 0))``, written with matmul/cat so it also exports to ONNX.
    """
    x, embed = x.float(), embed.float()
    x_norm = x.pow(2).sum(-1, keepdim=True)
    e_norm = embed.pow(2).sum(-1, keepdim=True)
    xa = torch.cat([x * -2, x_norm, torch.ones_like(x_norm)], dim=-1)
    ea = torch.cat([embed, torch.ones_like(e_norm), e_norm], dim=-1)
    dist = (xa @ ea.transpose(0, 1)).clamp_min(0).sqrt()
    return dist.argmin(dim=-1)


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: EncoderConfig, n: int):
        super().__init__()
        self.layers = nn.ModuleList(VectorQuantization(cfg.codebook_size, cfg.codebook_dim) for _ in range(n))
        vq_dim = cfg.vector_quantization_hidden_dimension
        if vq_dim != cfg.hidden_size:
            self.input_proj = nn.Conv1d(cfg.hidden_size, vq_dim, 1, bias=False)
            self.output_proj = nn.Conv1d(vq_dim, cfg.hidden_size, 1, bias=False)
        else:
            self.input_proj = self.output_proj = None

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """``x`` [B, hidden, T] -> codes [B, n, T] (first ``n`` residual stages)."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        b, d, t = x.shape
        residual = x.permute(0, 2, 1).reshape(b * t, d)
        codes = []
        for layer in self.layers[:n]:
            embed = layer.codebook.embed()
            idx = nearest_code(residual, embed)
            residual = residual - F.embedding(idx, embed)
            codes.append(idx.view(b, t))
        return torch.stack(codes, dim=1)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.n_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, self.n_semantic)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(
            cfg, cfg.num_quantizers - self.n_semantic
        )

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            rest = self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)
            codes = torch.cat([codes, rest], dim=1)
        return codes


class Encoder(nn.Module):
    """``encode(wav [B, N] fp32 24 kHz) -> LongTensor [B, ceil(N/1920), valid_quantizers]``."""

    def __init__(self, cfg: EncoderConfig, valid_quantizers: int = 16):
        super().__init__()
        if not cfg.num_semantic_quantizers <= valid_quantizers <= cfg.num_quantizers:
            raise ValueError(f"valid_quantizers {valid_quantizers} outside 1..{cfg.num_quantizers}")
        self.config = cfg
        self.valid_quantizers = valid_quantizers
        hop = math.prod(int(r) for r in cfg.upsampling_ratios)
        stride = round(cfg.sampling_rate / hop / cfg.frame_rate)
        self.samples_per_frame = hop * stride
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = Transformer(cfg)
        self.downsample = CausalConv(
            cfg, cfg.hidden_size, cfg.hidden_size, 2 * stride, stride=2, bias=False, pad_mode="replicate"
        )
        self.quantizer = SplitResidualVectorQuantizer(cfg)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """``wav`` [B, N] -> codes [B, valid_quantizers, ceil(N / samples_per_frame)] (no trimming)."""
        x = self.encoder(wav[:, None, :])  # [B, hidden, ceil(N/960)]
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        x = self.downsample(x)  # [B, hidden, frames]
        return self.quantizer.encode(x, self.valid_quantizers)

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, ceil(N/1920), 16]`` (int64) for ``wav`` [B, N] float 24 kHz.

        Rows of a right-zero-padded batch keep codes past their own end; use :meth:`encode_list`
        for the official per-item cut.
        """
        param = next(self.parameters())
        codes = self(wav.to(device=param.device, dtype=param.dtype))
        return codes.transpose(1, 2).long()

    def encode_list(self, wavs) -> list[torch.Tensor]:
        """Official batching: pad to the longest with zeros, encode, cut each to ceil(len/1920) frames."""
        lengths = [int(w.shape[-1]) for w in wavs]
        batch = torch.zeros(len(wavs), max(lengths))
        for i, w in enumerate(wavs):
            batch[i, : lengths[i]] = torch.as_tensor(w, dtype=torch.float32)
        codes = self.encode(batch)
        return [c[: -(-n // self.samples_per_frame)] for c, n in zip(codes, lengths)]
