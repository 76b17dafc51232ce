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

from .aligner_config import AlignerAudioConfig
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


def chunk_mel(mel: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host-side cut of ``mel [n_mels, frames]`` into conv chunks: ``chunks [C, n_mels, W]``, every
    chunk zero padded to the longest (W = min(frames, chunk)), and ``keep [N]``, the flat indices
    (chunk * T' + token) of the valid conv outputs, in order."""
    lengths = chunk_lengths(mel.shape[1], chunk)
    if not lengths:
        raise ValueError("the aligner needs at least one mel frame of audio")
    width = max(lengths)
    chunks = torch.stack([F.pad(piece, (0, width - piece.shape[1])) for piece in mel.split(lengths, dim=1)])
    per_chunk = conv_out_len(width)
    keep = [i * per_chunk + j for i, n in enumerate(lengths) for j in range(conv_out_len(n))]
    return chunks, torch.tensor(keep, dtype=torch.long)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, N, dim] -> [B, N, dim]
        b, n, _ = x.shape

        def heads(t):  # [B, N, dim] -> [B, heads, N, hd]
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = grouped_attention(q, k, v, None, self.head_dim**-0.5)  # [B, heads, N, hd]
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1))


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
    """log-mel ``[n_mels, frames]`` -> audio embeddings ``[audio_tokens(frames), output_dim]``.

    The work splits where an export needs it: :func:`chunk_mel` (host, shapes only) cuts the
    mel; :meth:`encode` (the graph) runs convs, positions, the valid-token gather and the layers."""

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

    def conv_tokens(self, chunks: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Conv front end: ``chunks [C, n_mels, W]``, ``keep [N]`` -> valid tokens ``[1, N, d_model]``, positions added."""
        x = F.gelu(self.conv2d1(chunks[:, None]))
        x = F.gelu(self.conv2d2(x))
        x = F.gelu(self.conv2d3(x))  # [C, channels, F', T']
        b, c, f, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(b, t, c * f))  # [C, T', d_model]
        x = x + sinusoids(t, self.cfg.d_model).to(x.dtype)[None]
        return x.reshape(b * t, -1).index_select(0, keep)[None]

    def encode(self, chunks: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``chunks``, ``keep`` (:func:`chunk_mel`) -> audio embeddings ``[1, N, output_dim]``."""
        x = self.conv_tokens(chunks, keep)
        for layer in self.layers:
            x = layer(x)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """``mel [n_mels, frames]`` -> ``[audio_tokens(frames), output_dim]``."""
        return self.encode(*chunk_mel(mel, self.cfg.chunk_frames))[0]
