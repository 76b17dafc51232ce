"""qtts: fast, streaming, verifiable Qwen3-TTS inference.

Public API: ``load``, ``TTS``, ``Voice``, ``SynthesisOptions``, ``SamplingParams``, ``AudioChunk``,
``Audio``, ``ModelConfig`` (imported here: numpy and the engine, no torch and no runtime, which a
plan imports when it names one), and ``load_checkpoint`` (the torch loader, imported on first use).
"""

from __future__ import annotations

from .api import TTS, load
from .audio import Audio, AudioChunk
from .config import ModelConfig
from .options import SamplingParams, SynthesisOptions
from .version import __version__
from .voice import Voice

__all__ = ["Audio", "AudioChunk", "ModelConfig", "SamplingParams", "SynthesisOptions", "TTS", "Voice",
           "__version__", "load", "load_checkpoint"]


def __getattr__(name: str):
    if name == "load_checkpoint":  # torch: only for those who load a checkpoint as torch modules
        from .weights import load_checkpoint

        return load_checkpoint
    raise AttributeError(f"module 'qtts' has no attribute {name!r}")
