"""Qwen3-ForcedAligner: the root module of its ``model.safetensors`` and the strict loader.

``ForcedAlignerModel.thinker`` holds ``audio_tower`` (:mod:`~qtts.model.aligner_audio`),
``model`` and ``lm_head`` (:mod:`~qtts.model.aligner_text`), so every module path is a checkpoint
key (``thinker.audio_tower.conv2d1.weight``, ``thinker.model.layers.0.mlp.up_proj.weight``,
``thinker.lm_head.weight``). ``forward(input_ids, mel)`` is the aligner's one non-autoregressive
pass: the prompt's ``<|audio_pad|>`` embeddings are replaced, in order, by the audio encoder's
outputs, and the logits ``[B, T, classify_num]`` come back; reading them is :mod:`qtts.aligner`.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..aligner_config import AlignerConfig
from .aligner_audio import AlignerAudioEncoder
from .aligner_text import AlignerDecoder
from .checkpoint import empty_init, load_into, load_tensors, to_dtype


class Thinker(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.audio_tower = AlignerAudioEncoder(cfg.audio)
        self.model = AlignerDecoder(cfg.text)
        self.lm_head = nn.Linear(cfg.text.hidden_size, cfg.classify_num, bias=False)


class ForcedAlignerModel(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.cfg = cfg
        self.thinker = Thinker(cfg)

    def embed(self, input_ids: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
        """``input_ids [1, T]``, ``mel [n_mels, frames]`` -> prompt embeddings ``[1, T, H]``."""
        embeds = self.thinker.model.embed_tokens(input_ids)
        audio = self.thinker.audio_tower(mel.to(embeds.dtype))  # [N, H]
        slots = input_ids[0] == self.cfg.audio_token_id
        if int(slots.sum()) != audio.shape[0]:
            raise ValueError(
                f"the prompt has {int(slots.sum())} audio tokens but the audio gives {audio.shape[0]} "
                "embeddings; build the prompt with qtts.aligner (one <|audio_pad|> per encoder output)"
            )
        embeds = embeds.clone()
        embeds[0, slots] = audio
        return embeds

    def forward(self, input_ids: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != 1:
            raise ValueError("the aligner runs one (audio, text) pair per call: input_ids must be [1, T]")
        hidden = self.thinker.model(self.embed(input_ids, mel))
        return self.thinker.lm_head(hidden)  # [1, T, classify_num]


def load_aligner(path: str, dtype=torch.float32, config: AlignerConfig | None = None) -> ForcedAlignerModel:
    """Build on the meta device and load ``path``/model.safetensors strictly (assign, memory mapped)."""
    cfg = config or AlignerConfig.from_dir(path)
    with empty_init():
        model = ForcedAlignerModel(cfg)
    return load_into(model, load_tensors(path), os.path.join(path, "model.safetensors"), to_dtype(dtype))
