"""Root module of ``speech_tokenizer/model.safetensors``: ``decoder.*`` and ``encoder.*``."""

from __future__ import annotations

import torch
from torch import nn

from ..config import SpeechTokenizerConfig
from .speech_encoder import Encoder
from .vocoder import Decoder


class SpeechTokenizer(nn.Module):
    """Attributes ``decoder`` (codes -> 24 kHz audio) and ``encoder`` (audio -> 16 codebooks).

    Either may be set to ``None`` by a loader that needs only one half.
    """

    def __init__(self, cfg: SpeechTokenizerConfig):
        super().__init__()
        self.config = cfg
        self.decoder = Decoder(cfg.decoder_config)
        self.encoder = Encoder(cfg.encoder_config, cfg.encoder_valid_num_quantizers)

    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """``wav`` [B, N] fp32 24 kHz -> codes [B, ceil(N/1920), 16] (see :meth:`Encoder.encode`)."""
        return self.encoder.encode(wav)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` [B, 16, T] -> wav [B, 1, T*1920] (full offline decode)."""
        return self.decoder(codes)
