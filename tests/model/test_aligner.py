"""The forced aligner without the official package: snapshot layout, strict loading, config checks,
front end, word split, timestamp repair and the end-to-end invariants on a tiny random checkpoint."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REAL_TOKENIZER_DIR
from qtts.align import AlignedWord, ForcedAligner, prompt_text, repair_timestamps
from qtts.audio.aligner_features import log_mel, prepare_audio
from qtts.errors import ConfigError, InputError, MissingDependencyError
from qtts.model.aligner import ForcedAlignerModel, load_aligner
from qtts.model.aligner_audio import audio_tokens, conv_out_len
from qtts.model.aligner_config import AlignerConfig
from qtts.text.tokenizer import TextTokenizer
from qtts.text.words import split_words
from qtts.tools.random_aligner import aligner_config_dict
from qtts.tools.random_checkpoint import write_random_checkpoint

TOKENIZER = REAL_TOKENIZER_DIR
SPECIAL = {"<|audio_start|>": 151669, "<|audio_end|>": 151670, "<|audio_pad|>": 151676, "<timestamp>": 151705}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_random_checkpoint(str(tmp_path_factory.mktemp("al") / "tiny"), kind="forced_aligner",
                                   tokenizer_dir=TOKENIZER)  # fmt: skip


def tone(seconds: float, sr: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)


def test_snapshot_has_the_real_layout(snapshot):
    names = set(os.listdir(snapshot))
    assert {"config.json", "preprocessor_config.json", "tokenizer_config.json", "model.safetensors",
            "vocab.json", "merges.txt"} <= names  # fmt: skip
    cfg = AlignerConfig.from_dir(snapshot)
    assert (cfg.classify_num, cfg.timestamp_segment_time, cfg.timestamp_token_id) == (5000, 80, 151705)
    assert cfg.text.vocab_size == 152064 and cfg.audio.num_mel_bins == 128 and cfg.audio.chunk_frames == 100
    keys = set(load_file(os.path.join(snapshot, "model.safetensors")))
    assert keys == set(ForcedAlignerModel(cfg).state_dict())
    assert {"thinker.lm_head.weight", "thinker.audio_tower.conv2d1.weight", "thinker.model.norm.weight"} <= keys


@pytest.mark.parametrize("real_vocab", [True, False])
def test_tokenizer_puts_the_aligner_tokens_at_their_ids(tmp_path, real_vocab):
    out = write_random_checkpoint(str(tmp_path / "s"), kind="forced_aligner",
                                  tokenizer_dir=TOKENIZER if real_vocab else None)  # fmt: skip
    tok = TextTokenizer.from_dir(out)
    for name, idx in SPECIAL.items():
        assert tok.token_to_id(name) == idx
    ids = tok.encode(prompt_text(["hi", "there"], 3))
    assert ids[:5] == [151669, 151676, 151676, 151676, 151670] and ids.count(151705) == 4


def test_full_layout_has_the_published_dimensions():
    cfg = AlignerConfig.from_dict(aligner_config_dict("full"))
    assert (cfg.audio.encoder_layers, cfg.audio.d_model, cfg.audio.encoder_attention_heads) == (24, 1024, 16)
    assert (cfg.text.num_hidden_layers, cfg.text.hidden_size, cfg.text.num_key_value_heads) == (28, 1024, 8)
    with torch.device("meta"):
        n = sum(p.numel() for p in ForcedAlignerModel(cfg).parameters())
    # 917.7M: a public f16 GGUF of the published checkpoint is 1.84 GB (2 bytes each); "0.6B" is the decoder's name
    assert 0.91e9 < n < 0.925e9


def test_strict_loader_names_missing_and_misshapen_keys(snapshot, tmp_path):
    tensors = load_file(os.path.join(snapshot, "model.safetensors"))
    for fname in ("config.json",):
        with open(os.path.join(snapshot, fname), encoding="utf-8") as src:
            (tmp_path / fname).write_text(src.read(), encoding="utf-8")
    save_file({k: v for k, v in tensors.items() if k != "thinker.audio_tower.proj2.bias"},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    with pytest.raises(ConfigError, match="thinker.audio_tower.proj2.bias"):
        load_aligner(str(tmp_path))
    tensors["thinker.lm_head.weight"] = tensors["thinker.lm_head.weight"][:10].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match="lm_head"):
        load_aligner(str(tmp_path))


def test_config_rejects_an_asr_checkpoint_and_bad_shapes():
    cfg = aligner_config_dict("tiny")
    asr = json.loads(json.dumps(cfg))
    del asr["thinker_config"]["classify_num"]
    with pytest.raises(ConfigError, match="Qwen3-ASR"):
        AlignerConfig.from_dict(asr)
    cfg["thinker_config"]["audio_config"]["output_dim"] = 7
    with pytest.raises(ConfigError, match="output_dim 7"):
        AlignerConfig.from_dict(cfg)


def test_audio_token_count_follows_the_chunked_convs():
    cfg = AlignerConfig.from_dict(aligner_config_dict("tiny"))
    assert [conv_out_len(n) for n in (1, 8, 9, 100)] == [1, 1, 2, 13]
    assert audio_tokens(250, cfg.audio) == 13 + 13 + 7
    model = ForcedAlignerModel(cfg).eval()
    for frames in (37, 100, 250):
        with torch.no_grad():
            assert model.thinker.audio_tower(torch.randn(128, frames)).shape == (audio_tokens(frames, cfg.audio), 32)


def test_front_end_resamples_and_frames():
    wav16 = prepare_audio(tone(1.5), 24000)
    assert wav16.dtype == np.float32 and len(wav16) == 24000
    assert prepare_audio(np.full(1000, 4.0, np.float32), 16000).max() == pytest.approx(1.0)
    stereo = np.stack([tone(0.5, 16000), tone(0.5, 16000)], axis=1)
    assert np.allclose(prepare_audio(stereo, 16000), tone(0.5, 16000), atol=1e-6)
    mel = log_mel(wav16)
    assert mel.shape == (128, 24000 // 160) and float(mel.max() - mel.min()) <= 2.0 + 1e-6  # 8 dB floor / 4
    with pytest.raises(InputError, match="too short"):
        log_mel(np.zeros(150, np.float32))


def test_word_split_rules():
    assert split_words("Hello, world! Don't stop—3.5 times.", "English") == ["Hello", "world", "Don't", "stop35", "times"]
    assert split_words("你好，世界！OK吗", "chinese") == ["你", "好", "世", "界", "OK", "吗"]
    assert split_words("我们用 Python 写", "Chinese") == ["我", "们", "用", "Python", "写"]
    assert split_words(" ,.!? ", "English") == []


def test_japanese_without_its_splitter_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nagisa", None)  # import nagisa -> ImportError
    with pytest.raises(MissingDependencyError, match="align-cjk"):
        split_words("今日はいい天気", "Japanese")


def test_repair_keeps_the_longest_rising_run():
    assert repair_timestamps([]) == []
    assert repair_timestamps([0, 80, 160]) == [0, 80, 160]
    assert repair_timestamps([80, 4000, 160, 240]) == [80, 80, 160, 240]  # one outlier: nearer side (left on ties)
    assert repair_timestamps([80, 160, 0, 400]) == [80, 160, 160, 400]
    assert repair_timestamps([500, 80, 160]) == [80, 80, 160]  # no left neighbour: the right one
    # three or more outliers in a row: evenly spaced between the kept neighbours
    assert repair_timestamps([0, 80, 5000, 4000, 3000, 400, 480]) == [0, 80, 160, 240, 320, 400, 480]
    assert repair_timestamps([0, 80, 800, 700, 600, 400]) == [0, 80, 800, 800, 800, 800]  # no right one: left


def test_align_gives_one_ordered_span_per_word(snapshot):
    aligner = ForcedAligner.from_dir(snapshot)
    text = "One two, three! 四五 six"
    words = aligner.align(tone(2.0), 24000, text, "English")
    assert [w.text for w in words] == split_words(text, "English")
    assert all(isinstance(w, AlignedWord) and w.start <= w.end for w in words)
    assert all(a.end <= b.start for a, b in zip(words, words[1:]))
    assert aligner.align(tone(1.0), 24000, "?!", "English") == []


def test_random_checkpoint_refuses_talker_options(tmp_path):
    with pytest.raises(InputError, match="talker"):
        write_random_checkpoint(str(tmp_path / "x"), kind="forced_aligner", planted=True)
    with pytest.raises(InputError, match="tiny"):
        write_random_checkpoint(str(tmp_path / "y"), kind="forced_aligner", size="mid")


def test_cli_writes_an_aligner_checkpoint(tmp_path, capsys):
    from qtts.cli import main

    assert main(["random-checkpoint", str(tmp_path / "al"), "--kind", "forced_aligner", "--tokenizer", TOKENIZER]) == 0
    out = capsys.readouterr().out
    assert "forced_aligner" in out and "timestamps follow" in out and "codes" not in out  # no TTS notes
    assert AlignerConfig.from_dir(str(tmp_path / "al")).classify_num == 5000
