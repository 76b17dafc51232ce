"""Qwen3-ForcedAligner: the root module of its ``model.safetensors`` and the strict loader.

``ForcedAlignerModel.thinker`` holds ``audio_tower`` (:mod:`~qtts.model.aligner_audio`),
``model`` and ``lm_head`` (:mod:`~qtts.model.aligner_text`), so every module path is a checkpoint
key (``thinker.audio_tower.conv2d1.weight``, ``thinker.model.layers.0.mlp.up_proj.weight``,
``thinker.lm_head.weight``). ``forward(input_ids, mel)`` is the aligner's one non-autoregressive
pass: the prompt's ``<|audio_pad|>`` embeddings are replaced, in order, by the audio encoder's
outputs (the official ``masked_scatter``; the prompt keeps them together right after
``<|audio_start|>``, so here they are spliced in), and the logits ``[1, T, classify_num]`` come
back; reading them is :mod:`qtts.align`.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from .aligner_audio import AlignerAudioEncoder, chunk_mel
from .aligner_config import AlignerConfig
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

    def logits(self, input_ids: torch.Tensor, chunks: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The aligner's pass (and its exported graph): ``input_ids [1, T]`` whose positions 1..N are
        ``<|audio_pad|>``, the conv ``chunks`` and ``keep`` of :func:`chunk_mel` -> logits ``[1, T, classify_num]``."""
        t = self.thinker
        audio = t.audio_tower.encode(chunks, keep)  # [1, N, H]
        embed = t.model.embed_tokens
        n = audio.shape[1]
        x = torch.cat([embed(input_ids[:, :1]), audio.to(embed.weight.dtype), embed(input_ids[:, 1 + n :])], dim=1)
        return t.lm_head(t.model(x))

    def forward(self, input_ids: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
        """``input_ids [1, T]``, log-mel ``[n_mels, frames]`` -> logits ``[1, T, classify_num]``."""
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError("the aligner runs one (audio, text) pair per call: input_ids must be [1, T]")
        chunks, keep = chunk_mel(mel.to(self.thinker.lm_head.weight.dtype), self.cfg.audio.chunk_frames)
        slots = input_ids[0] == self.cfg.audio_token_id
        n = keep.shape[0]
        if int(slots.sum()) != n or not bool(slots[1 : 1 + n].all()):
            raise ValueError(
                f"the prompt must hold the audio's {n} <|audio_pad|> tokens right after <|audio_start|> "
                f"(it has {int(slots.sum())}); build it with qtts.align.prompt_text"
            )
        return self.logits(input_ids, chunks, keep)


def load_aligner(path: str, dtype=torch.float32, config: AlignerConfig | None = None) -> ForcedAlignerModel:
    """Build on the meta device and load ``path``/model.safetensors strictly (assign, memory mapped)."""
    cfg = config or AlignerConfig.from_dir(path)
    with empty_init():
        model = ForcedAlignerModel(cfg)
    return load_into(model, load_tensors(path), os.path.join(path, "model.safetensors"), to_dtype(dtype))
