"""The code predictor ("sub-talker"): a small Qwen3 decoder predicting codebooks 1..15 of a frame.

Checkpoint prefix ``talker.code_predictor.``; attributes: ``model.layers[i]``, ``model.norm``,
``model.codec_embedding[0..14]`` (width = talker hidden), ``lm_head[0..14]`` and, when the talker
is wider than the predictor (1.7B), ``small_to_mtp_projection`` (Linear with bias; Identity
otherwise, so it has no keys).

One frame: a fresh cache, prefill ``[talker_hidden, talker.codec_embedding(code0)]`` at
positions 0-1 -> ``head(0)`` gives code 1; then for j = 1..14 feed ``embed(j-1, code_j)`` at
position j+1 -> ``head(j)`` gives code j+1.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import PredictorConfig
from .layers import DecoderLayer, RMSNorm, new_kv_cache, run_stack


class PredictorModel(nn.Module):
    def __init__(self, cfg: PredictorConfig, talker_hidden: int):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, cfg: PredictorConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.model = PredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        if talker_hidden != cfg.hidden_size:
            self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def embed(self, j: int, codes: torch.Tensor) -> torch.Tensor:
        """Codes of codebook ``j+1`` (j in 0..14) -> talker-width vectors ``[..., H_talker]``."""
        return self.model.codec_embedding[j](codes)

    def new_cache(self, max_len: int = 17, batch: int = 1, dtype=None, device=None) -> torch.Tensor:
        """Zeroed KV cache; a frame uses positions 0..15 (every slot is kept, never a sliding window)."""
        ref = self.lm_head[0].weight
        return new_kv_cache(self.cfg, max_len, batch, dtype or ref.dtype, device or ref.device)

    def forward(
        self, embeds: torch.Tensor, pos: int, cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``embeds [B,T,H_talker]`` at positions ``pos..`` -> (hidden [B,T,H_pred] after the final norm, cache)."""
        x = self.small_to_mtp_projection(embeds)
        return run_stack(self.model.layers, self.model.norm, x, pos, cache, self.cfg)

    def head(self, j: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` for codebook ``j+1`` from predictor hidden states."""
        return self.lm_head[j](hidden)
