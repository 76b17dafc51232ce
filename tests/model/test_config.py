"""Config dataclasses: the five real configs parse; errors name the file and the key."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import reference
from qtts.config import ModelConfig
from qtts.errors import ConfigError

REAL = [
    "Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "Qwen3-TTS-12Hz-1.7B-Base",
    "Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
]


@pytest.mark.parametrize("name", REAL)
def test_real_configs_parse(name):
    path = reference("configs", name)
    cfg = ModelConfig.from_dir(path)
    raw = json.load(open(os.path.join(path, "config.json")))
    assert cfg.tts_model_type == raw["tts_model_type"]
    assert cfg.talker.hidden_size == raw["talker_config"]["hidden_size"]
    assert cfg.talker.num_hidden_layers == 28 and cfg.predictor.num_hidden_layers == 5
    assert cfg.talker.vocab_size == 3072 and cfg.predictor.vocab_size == 2048
    assert cfg.talker.text_vocab_size == 151936 and cfg.talker.codec_eos_token_id == 2150
    assert (cfg.speaker_encoder is not None) == (cfg.tts_model_type == "base")
    if cfg.speaker_encoder is not None:
        assert cfg.speaker_encoder.enc_dim == cfg.talker.hidden_size
    if cfg.tts_model_type == "custom_voice":
        assert cfg.talker.speaker_token("vivian") == 3065
    assert cfg.speech_tokenizer.decoder_config.samples_per_frame == 1920
    assert cfg.generation.top_k == 50 and cfg.generation.repetition_penalty == 1.05
    assert "english" in cfg.languages


@pytest.mark.parametrize(
    "block,key",
    [
        (None, "tts_model_type"),
        ("talker_config", "hidden_size"),
        ("talker_config.code_predictor_config", "num_hidden_layers"),
        ("speaker_encoder_config", "enc_dim"),
    ],
)
def test_missing_key_names_file_and_key(tmp_path, block, key):
    src = reference("configs", "Qwen3-TTS-12Hz-0.6B-Base")
    dst = tmp_path / "snap"
    shutil.copytree(src, dst)
    data = json.load(open(dst / "config.json"))
    node = data
    for part in block.split(".") if block else []:
        node = node[part]
    del node[key]
    (dst / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dir(str(dst))
    msg = str(info.value)
    assert "config.json" in msg and f"'{key}'" in msg
    if block:
        assert block in msg


def test_missing_speech_tokenizer_key(tmp_path):
    dst = tmp_path / "snap"
    shutil.copytree(reference("configs", "Qwen3-TTS-12Hz-0.6B-Base"), dst)
    st = dst / "speech_tokenizer" / "config.json"
    data = json.load(open(st))
    del data["decoder_config"]["codebook_size"]
    st.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"speech_tokenizer.*config\.json.*decoder_config.*'codebook_size'"):
        ModelConfig.from_dir(str(dst))


def test_unknown_keys_tolerated(tmp_path):
    dst = tmp_path / "snap"
    shutil.copytree(reference("configs", "Qwen3-TTS-12Hz-1.7B-Base"), dst)
    data = json.load(open(dst / "config.json"))
    data["some_future_key"] = {"x": 1}
    data["talker_config"]["another_new_field"] = [1, 2, 3]
    (dst / "config.json").write_text(json.dumps(data))
    cfg = ModelConfig.from_dir(str(dst))
    assert cfg.talker.hidden_size == 2048


def test_missing_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        ModelConfig.from_dir(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="config.json: file not found"):
        ModelConfig.from_dir(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_dir(str(tmp_path))
