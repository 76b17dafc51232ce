"""qtts: fast, streaming, verifiable Qwen3-TTS inference.

Public API (imported lazily so ``import qtts`` stays light and torch-free):
``load``, ``TTS``, ``Voice``, ``SynthesisOptions``, ``AudioChunk``, ``Audio``, ``load_checkpoint``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "AudioChunk": ("qtts.audio", "AudioChunk"),
    "Audio": ("qtts.audio", "Audio"),
    "ModelConfig": ("qtts.config", "ModelConfig"),
    "load_checkpoint": ("qtts.weights", "load_checkpoint"),
    "load": ("qtts.api", "load"),
    "TTS": ("qtts.api", "TTS"),
    "Voice": ("qtts.voice", "Voice"),
    "SynthesisOptions": ("qtts.options", "SynthesisOptions"),
    "SamplingParams": ("qtts.options", "SamplingParams"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'qtts' has no attribute {name!r}")
