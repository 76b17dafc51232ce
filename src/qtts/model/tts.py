"""Root module of ``model.safetensors``: ``talker`` and, for Base checkpoints, ``speaker_encoder``."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .talker import Talker


class Qwen3TTS(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.talker = Talker(cfg.talker)
        if cfg.tts_model_type == "base":
            from .speaker import SpeakerEncoder  # another part's file: imported lazily

            self.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder)
        else:
            self.speaker_encoder = None
