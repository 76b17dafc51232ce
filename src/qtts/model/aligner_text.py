"""The forced aligner's Qwen3 decoder (``thinker.model``) and its timestamp head, pure torch.

Module paths equal the checkpoint keys under ``thinker.``: ``model.embed_tokens``,
``model.layers.N`` (the talker's :class:`~qtts.model.layers.DecoderLayer`: GQA with q/k RMSNorm,
SwiGLU), ``model.norm`` and ``lm_head`` (``classify_num`` = 5000 timestamp classes instead of the
text vocabulary).

One causal pass over the whole prompt (the official model builds a causal mask although it never
generates): the prompt's positions are 0 .. T-1 on all three M-RoPE streams, so its interleaved
M-RoPE is the plain 1-D RoPE of :mod:`qtts.model.layers`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..aligner_config import AlignerTextConfig
from .layers import DecoderLayer, RMSNorm, new_kv_cache, run_stack


class AlignerDecoder(nn.Module):
    """Keys ``embed_tokens``, ``layers.N``, ``norm``: embeddings ``[B, T, H]`` -> final-normed ``[B, T, H]``."""

    def __init__(self, cfg: AlignerTextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        b, t, _ = embeds.shape
        cache = new_kv_cache(self.cfg, t, batch=b, dtype=embeds.dtype, device=embeds.device)
        hidden, _ = run_stack(self.layers, self.norm, embeds, 0, cache, self.cfg)
        return hidden
