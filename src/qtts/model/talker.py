"""The talker: a Qwen3 decoder over summed text+codec embeddings that predicts codebook 0.

Checkpoint prefix ``talker.``; attribute paths equal the checkpoint keys:
``model.text_embedding``, ``model.codec_embedding``, ``model.layers[i]``, ``model.norm``,
``text_projection.linear_fc1/linear_fc2``, ``codec_head``, ``code_predictor``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TalkerConfig
from .layers import DecoderLayer, RMSNorm, new_kv_cache, run_stack, run_stack_rows
from .predictor import CodePredictor


class TextProjection(nn.Module):
    """Linear(text_hidden -> text_hidden, bias) -> SiLU -> Linear(text_hidden -> H, bias)."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor_config, cfg.hidden_size)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids ``[...]`` -> talker-width vectors ``[..., H]`` (embedding + projection)."""
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codec ids ``[...]`` (codebook-0 codes, control ids, speaker rows) -> ``[..., H]``."""
        return self.model.codec_embedding(ids)

    def new_cache(self, max_len: int, batch: int = 1, dtype=None, device=None) -> torch.Tensor:
        """Zeroed KV cache ``[layers, 2, batch, kv_heads, max_len, head_dim]`` (model dtype/device by default)."""
        ref = self.codec_head.weight
        return new_kv_cache(self.cfg, max_len, batch, dtype or ref.dtype, device or ref.device)

    def forward(
        self, embeds: torch.Tensor, pos: int, cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``embeds [B,T,H]`` at positions ``pos..pos+T-1`` -> (logits [B,T,vocab], hidden [B,T,H], cache).

        ``hidden`` is after the final RMSNorm: what ``codec_head`` sees and what the code
        predictor receives as its first input.
        """
        hidden, cache = run_stack(self.model.layers, self.model.norm, embeds, pos, cache, self.cfg)
        return self.codec_head(hidden), hidden, cache

    def forward_rows(
        self, embeds: torch.Tensor, positions: list[int], caches: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of ``B`` streams: ``embeds [B,1,H]``, row b at ``positions[b]`` with its own
        cache ``caches[b]`` -> (logits [B,1,vocab], hidden [B,1,H]); the caches are written in place."""
        hidden = run_stack_rows(self.model.layers, self.model.norm, embeds, positions, caches, self.cfg)
        return self.codec_head(hidden), hidden
