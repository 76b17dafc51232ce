"""The forced aligner's audio encoder (``thinker.audio_tower``), pure torch.

Module paths equal the checkpoint keys under ``thinker.audio_tower.``: ``conv2d1..3``,
``conv_out``, ``layers.N.{self_attn.{q,k,v,out}_proj, self_attn_layer_norm, fc1, fc2,
final_layer_norm}``, ``ln_post``, ``proj1``, ``proj2``. The sinusoidal position table is computed,
not stored (the official module keeps it as a non-persistent buffer, so it is not in the file).

Numerics follow the official ``Qwen3ASRAudioEncoder`` (qwen-asr 0.0.6) on its eager/SDPA path:

* the log-mel ``[n_mels, frames]`` is cut into chunks of ``2 * n_window`` frames (the last one
  shorter), every chunk zero padded to the longest chunk, and each chunk goes through three
  3x3 stride-2 convs with GELU; ``conv_out`` flattens (channels, mel bins) per time step;
* each chunk gets the sinusoidal positions 0, 1, ... of its own tokens; padded tokens are dropped;
* all tokens of the audio then attend to each other (one bidirectional sequence: the official
  eager/SDPA path passes no window mask; only its flash-attention path restricts attention to
  ``n_window_infer`` windows, see docs/timestamps.md);
* pre-LayerNorm layers (attention with biases, exact-GELU MLP), ``ln_post``, ``proj1``, GELU, ``proj2``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..aligner_config import AlignerAudioConfig
from .layers import grouped_attention


def conv_out_len(frames: int) -> int:
    """Tokens the three stride-2 convs make of ``frames`` mel frames (100 -> 13)."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def chunk_lengths(frames: int, chunk: int) -> list[int]:
    """Frames per conv chunk: full chunks of ``chunk`` frames, then the remainder (if any)."""
    full, rest = divmod(int(frames), chunk)
    return [chunk] * full + ([rest] if rest else [])


def audio_tokens(frames: int, cfg: AlignerAudioConfig) -> int:
    """Audio-encoder outputs (= ``<|audio_pad|>`` tokens in the prompt) for ``frames`` mel frames."""
    return sum(conv_out_len(n) for n in chunk_lengths(frames, cfg.chunk_frames))


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """``[length, channels]`` = [sin | cos] of ``pos * exp(-log(max_timescale) * i / (channels/2 - 1))``."""
    half = channels // 2
    inv = torch.exp(-(math.log(max_timescale) / (half - 1)) * torch.arange(half).float())
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class AudioAttention(nn.Module):
    """Bidirectional multi-head attention with biases (keys ``q_proj k_proj v_proj out_proj``)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, dim] -> [N, dim]
        n = x.shape[0]

        def heads(t):  # [N, dim] -> [1, heads, N, hd]
            return t.view(n, self.heads, self.head_dim).transpose(0, 1)[None]

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = grouped_attention(q, k, v, None, self.head_dim**-0.5)  # [1, heads, N, hd]
        return self.out_proj(out[0].transpose(0, 1).reshape(n, -1))


class AudioEncoderLayer(nn.Module):
    def __init__(self, cfg: AlignerAudioConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = AudioAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AlignerAudioEncoder(nn.Module):
    """log-mel ``[n_mels, frames]`` -> audio embeddings ``[audio_tokens(frames), output_dim]``."""

    def __init__(self, cfg: AlignerAudioConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        mel_out = ((((cfg.num_mel_bins + 1) // 2) + 1) // 2 + 1) // 2  # mel bins after three stride-2 convs
        self.conv_out = nn.Linear(c * mel_out, cfg.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)

    def embed_chunks(self, mel: torch.Tensor) -> torch.Tensor:
        """Conv front end: ``[n_mels, frames]`` -> the valid chunk tokens ``[N, d_model]`` (positions added)."""
        lengths = chunk_lengths(mel.shape[1], self.cfg.chunk_frames)
        if not lengths:
            raise ValueError("the aligner needs at least one mel frame of audio")
        width = max(lengths)
        chunks = [F.pad(piece, (0, width - piece.shape[1])) for piece in mel.split(lengths, dim=1)]
        x = torch.stack(chunks)[:, None]  # [chunks, 1, n_mels, width]
        x = F.gelu(self.conv2d1(x))
        x = F.gelu(self.conv2d2(x))
        x = F.gelu(self.conv2d3(x))  # [chunks, C, F', T']
        b, c, f, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(b, t, c * f))  # [chunks, T', d_model]
        x = x + sinusoids(t, self.cfg.d_model).to(x.dtype)[None]
        keep = [conv_out_len(n) for n in lengths]
        return torch.cat([x[i, :n] for i, n in enumerate(keep)])

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.embed_chunks(mel)
        for layer in self.layers:
            x = layer(x)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))
