"""Our module trees have exactly the official tensor names and shapes (full-size configs, meta device).

The reference lists in ``tests/data/reference/tensor-names/`` were derived from the official classes
instantiated with the real configs.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import reference
from qtts.config import ModelConfig, SpeechTokenizerConfig
from qtts.tools.random_checkpoint import real_config_dir


def _reference(name: str) -> dict[str, list[int]]:
    path = reference("tensor-names", f"{name}.txt")
    out = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#") or not line.strip():
                continue
            key, shape = line.rstrip("\n").split("\t")
            out[key] = [int(s) for s in shape.strip("[]").split(",") if s.strip()]
    return out


def _ours(module: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in module.state_dict().items()}


def _compare(ours: dict, ref: dict) -> None:
    missing = sorted(set(ref) - set(ours))
    extra = sorted(set(ours) - set(ref))
    assert not missing and not extra, (
        f"missing {missing[:20]} ({len(missing)}), unexpected {extra[:20]} ({len(extra)})"
    )
    wrong = {k: (ours[k], ref[k]) for k in ref if ours[k] != ref[k]}
    assert not wrong, f"shape mismatches (ours, reference): {dict(list(wrong.items())[:20])}"


@pytest.mark.parametrize(
    "name", ["Qwen3-TTS-12Hz-0.6B-Base", "Qwen3-TTS-12Hz-1.7B-Base", "Qwen3-TTS-12Hz-0.6B-CustomVoice"]
)
def test_main_checkpoint_names_and_shapes(name):
    from qtts.model.tts import Qwen3TTS

    cfg = ModelConfig.from_dir(real_config_dir(name), speech_tokenizer=False)
    with torch.device("meta"):
        model = Qwen3TTS(cfg)
    _compare(_ours(model), _reference(name))


def test_speech_tokenizer_names_and_shapes():
    from qtts.model.speech_tokenizer import SpeechTokenizer

    cfg = SpeechTokenizerConfig.from_file(
        os.path.join(real_config_dir("Qwen3-TTS-12Hz-0.6B-Base"), "speech_tokenizer", "config.json")
    )
    with torch.device("meta"):
        model = SpeechTokenizer(cfg)
    _compare(_ours(model), _reference("speech_tokenizer"))
