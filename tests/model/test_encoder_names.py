"""Full-size module trees of the speaker encoder and the codec encoder carry exactly the
checkpoint tensor names and shapes listed in tests/data/reference/tensor-names/ (built on meta)."""

from __future__ import annotations

import pytest
import torch

from conftest import reference, reference_configs
from qtts.config import ModelConfig
from qtts.model.speaker import SpeakerEncoder
from qtts.model.speech_encoder import Encoder


def _expected(file: str, prefix: str) -> dict[str, list[int]]:
    out = {}
    with open(reference("tensor-names", file), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(prefix) and not line.startswith("#"):
                name, shape = line.rstrip("\n").split("\t")
                out[name[len(prefix) :]] = [int(s) for s in shape.strip("[]").split(",") if s.strip()]
    return out


def _ours(module: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in module.state_dict().items()}


@pytest.mark.parametrize("size", ["0.6B", "1.7B"])
def test_speaker_encoder_names_and_shapes(size):
    cfg = ModelConfig.from_dir(reference_configs(f"Qwen3-TTS-12Hz-{size}-Base"))
    with torch.device("meta"):
        model = SpeakerEncoder(cfg.speaker_encoder)
    assert _ours(model) == _expected(f"Qwen3-TTS-12Hz-{size}-Base.txt", "speaker_encoder.")


def test_codec_encoder_names_and_shapes():
    cfg = ModelConfig.from_dir(reference_configs("Qwen3-TTS-12Hz-0.6B-Base"))
    st = cfg.speech_tokenizer
    with torch.device("meta"):
        model = Encoder(st.encoder_config, st.encoder_valid_num_quantizers)
    expected = _expected("speech_tokenizer.txt", "encoder.")
    assert len(expected) == 225
    assert _ours(model) == expected
    assert model.samples_per_frame == 1920


def test_speech_tokenizer_root_names_and_shapes():
    from qtts.model.speech_tokenizer import SpeechTokenizer

    cfg = ModelConfig.from_dir(reference_configs("Qwen3-TTS-12Hz-0.6B-Base"))
    with torch.device("meta"):
        model = SpeechTokenizer(cfg.speech_tokenizer)
    expected = _expected("speech_tokenizer.txt", "")
    assert len(expected) == 496
    assert _ours(model) == expected
