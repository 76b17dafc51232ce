"""The forced aligner's Qwen3 decoder (``thinker.model``) and its timestamp head, pure torch.

Module paths equal the checkpoint keys under ``thinker.``: ``model.embed_tokens``,
``model.layers.N`` (the talker's :class:`~qtts.model.layers.DecoderLayer`: GQA with q/k RMSNorm,
SwiGLU), ``model.norm`` and ``lm_head`` (``classify_num`` = 5000 timestamp classes instead of the
text vocabulary).

One causal pass over the whole prompt (the official model builds a causal mask although it never
generates), with no KV cache: nothing is decoded after it. The prompt's positions are 0 .. T-1 on
all three M-RoPE streams, so its interleaved M-RoPE is the plain 1-D RoPE of :mod:`qtts.model.layers`.
Every step is a :mod:`qtts.model.layers` primitive (projections, q/k norms and RoPE in
``Attention.qkv``, :func:`~qtts.model.layers.grouped_attention`, the MLP, the norms); only the
cache is left out, so the same code exports to ONNX with dynamic lengths.
"""

from __future__ import annotations

import torch
from torch import nn

from .aligner_config import AlignerTextConfig
from .layers import DecoderLayer, RMSNorm, causal_mask, grouped_attention, rope_cos_sin


class AlignerDecoder(nn.Module):
    """Keys ``embed_tokens``, ``layers.N``, ``norm``: embeddings ``[B, T, H]`` -> final-normed ``[B, T, H]``."""

    def __init__(self, cfg: AlignerTextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        mask = causal_mask(0, t, device=x.device)
        for layer in self.layers:
            attn = layer.self_attn
            q, k, v = attn.qkv(layer.input_layernorm(x), cos, sin)
            out = grouped_attention(q, k, v, mask, attn.head_dim**-0.5)  # [B, heads, T, hd]
            x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, attn.heads * attn.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)
