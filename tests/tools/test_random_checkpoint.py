"""``qtts random-checkpoint``: configs of both sizes, tiny snapshots of every kind/layout, official loading."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import REAL_TOKENIZER_DIR, reference
from qtts.cli import main
from qtts.config import ModelConfig, SpeechTokenizerConfig
from qtts.errors import InputError
from qtts.tools.random_checkpoint import (
    model_config_dict,
    real_config_dir,
    real_name,
    speech_tokenizer_config_dict,
    write_random_checkpoint,
)

VALID = [
    ("base", "0.6b"),
    ("base", "1.7b"),
    ("custom_voice", "0.6b"),
    ("custom_voice", "1.7b"),
    ("voice_design", "1.7b"),
]
SHRUNK_TALKER = {
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "text_hidden_size",
    "rope_scaling",
    "code_predictor_config",
}


def _header_count(name: str) -> int:
    with open(reference("tensor-names", f"{name}.txt")) as fh:
        return int(fh.readline().split(" tensors, ")[1].split(" elements")[0])


@pytest.mark.parametrize("kind,layout", VALID)
def test_full_config_is_the_real_one_and_sizes_match(kind, layout):
    from qtts.tools.random_weights import main_specs, speech_tokenizer_specs

    name = real_name(kind, layout)
    real = json.load(open(reference("configs", name, "config.json")))
    cfg = model_config_dict("full", kind, layout)
    assert cfg == real
    specs = main_specs(ModelConfig.from_dict(cfg))
    n = sum(torch.Size(s.shape).numel() for s in specs)
    ref = os.path.join(
        os.path.dirname(reference("tensor-names", "speech_tokenizer.txt")), f"{name}.txt"
    )
    if os.path.exists(ref):
        assert n == _header_count(name)
    assert n > 900e6
    st = SpeechTokenizerConfig.from_file(reference("configs", name, "speech_tokenizer", "config.json"))
    assert speech_tokenizer_config_dict("full") == json.load(
        open(reference("configs", name, "speech_tokenizer", "config.json"))
    )
    assert sum(torch.Size(s.shape).numel() for s in speech_tokenizer_specs(st)) == _header_count(
        "speech_tokenizer"
    )


@pytest.mark.parametrize("kind,layout", VALID)
def test_tiny_config_keeps_ids_and_vocabs(kind, layout):
    real = json.load(open(os.path.join(real_config_dir(real_name(kind, layout)), "config.json")))
    tiny = model_config_dict("tiny", kind, layout)
    for key, value in real.items():
        if key not in ("talker_config", "speaker_encoder_config"):
            assert tiny[key] == value, key
    for key, value in real["talker_config"].items():
        if key not in SHRUNK_TALKER:
            assert tiny["talker_config"][key] == value, key
    cfg = ModelConfig.from_dict(tiny)
    assert (cfg.talker.vocab_size, cfg.predictor.vocab_size, cfg.talker.text_vocab_size) == (
        3072,
        2048,
        151936,
    )
    assert cfg.talker.num_code_groups == cfg.predictor.num_code_groups == 16
    assert (cfg.talker.hidden_size != cfg.predictor.hidden_size) == (layout == "1.7b")
    assert cfg.talker.num_attention_heads > cfg.talker.num_key_value_heads > 1  # real GQA grouping
    assert cfg.talker.head_dim // 2 == sum(tiny["talker_config"]["rope_scaling"]["mrope_section"])
    assert (cfg.speaker_encoder is not None) == (kind == "base")
    if cfg.speaker_encoder is not None:
        assert cfg.speaker_encoder.enc_dim == cfg.talker.hidden_size
    st = speech_tokenizer_config_dict("tiny")
    dec = st["decoder_config"]
    assert (dec["codebook_size"], dec["num_quantizers"]) == (2048, 16)
    samples = 1
    for r in dec["upsample_rates"] + dec["upsampling_ratios"]:
        samples *= r
    assert samples == 1920 and st["encoder_config"]["_frame_rate"] == 12.5


def test_voice_design_needs_17b_layout(tmp_path):
    with pytest.raises(InputError, match="1.7b"):
        write_random_checkpoint(str(tmp_path / "x"), kind="voice_design", layout="0.6b")
    code = main(["random-checkpoint", str(tmp_path / "y"), "--kind", "voice_design", "--layout", "0.6b"])
    assert code == 2 and not (tmp_path / "y").exists()


@pytest.mark.parametrize("kind,layout", VALID)
def test_official_package_loads_tiny_snapshot(tiny_snapshot, official_tts, kind, layout):
    path = tiny_snapshot(kind=kind, layout=layout)
    official = official_tts(path).model
    files = load_file(os.path.join(path, "model.safetensors"))
    state = official.state_dict()
    assert set(state) == set(files)
    assert all(torch.equal(state[k], files[k]) for k in files)
    st_files = load_file(os.path.join(path, "speech_tokenizer", "model.safetensors"))
    st_state = official.speech_tokenizer.model.state_dict()
    assert set(st_state) == set(st_files)
    assert all(torch.equal(st_state[k], st_files[k]) for k in st_files)
    assert official.tts_model_type == kind
    if kind == "custom_voice":
        assert "vivian" in official.get_supported_speakers()


def test_weights_are_non_degenerate(tiny_snapshot):
    path = tiny_snapshot()
    main_t = load_file(os.path.join(path, "model.safetensors"))
    st = load_file(os.path.join(path, "speech_tokenizer", "model.safetensors"))
    norm = main_t["talker.model.layers.0.self_attn.q_norm.weight"]
    assert 0.6 < norm.min().item() and norm.max().item() < 1.4 and norm.std().item() > 0.03  # near 1, not 1
    assert 0.04 < main_t["talker.codec_head.weight"].std().item() < 0.06
    emb = st["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"]
    usage = st["decoder.quantizer.rvq_first.vq.layers.0._codebook.cluster_usage"]
    assert 0.9 < emb.std().item() < 1.1 and 0.5 <= usage.min().item() and usage.max().item() <= 1.5
    init = [v for k, v in st.items() if k.endswith("codebook.initialized")]
    assert init and all(torch.equal(v, torch.ones_like(v)) for v in init)
    scales = [v for k, v in st.items() if k.startswith("decoder.") and k.endswith("layer_scale.scale")]
    assert scales and all(torch.allclose(v, torch.full_like(v, 0.01)) for v in scales)


def test_seed_determinism_and_bf16(tmp_path):
    a = write_random_checkpoint(str(tmp_path / "a"), kind="custom_voice", seed=5)
    b = write_random_checkpoint(str(tmp_path / "b"), kind="custom_voice", seed=5, dtype="bfloat16")
    c = write_random_checkpoint(str(tmp_path / "c"), kind="custom_voice", seed=6)
    ta, tb, tc = (load_file(os.path.join(p, "model.safetensors")) for p in (a, b, c))
    k = "talker.codec_head.weight"
    assert tb[k].dtype == torch.bfloat16 and torch.equal(tb[k], ta[k].bfloat16())
    assert not torch.equal(ta[k], tc[k])
    with safe_open(os.path.join(b, "speech_tokenizer", "model.safetensors"), "pt") as fh:
        key = next(n for n in fh.keys() if n.startswith("encoder.") and n.endswith("codebook.cluster_usage"))
        assert fh.get_tensor(key).dtype == torch.float32  # buffers keep their own dtype
    assert sorted(os.listdir(a)) == sorted(
        [
            "config.json",
            "configuration.json",
            "generation_config.json",
            "preprocessor_config.json",
            "tokenizer_config.json",
            "tokenizer.json",
            "model.safetensors",
            "speech_tokenizer",
        ]
    )
    assert sorted(os.listdir(os.path.join(a, "speech_tokenizer"))) == [
        "config.json",
        "configuration.json",
        "model.safetensors",
        "preprocessor_config.json",
    ]


def test_standin_tokenizer_ids(tiny_snapshot, official_tts):
    from tokenizers import Tokenizer

    path = tiny_snapshot(kind="base", layout="0.6b", real_tokenizer=False)
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    real_vocab = json.load(open(os.path.join(REAL_TOKENIZER_DIR, "vocab.json")))
    added = json.load(open(os.path.join(path, "tokenizer_config.json")))["added_tokens_decoder"]
    for idx, spec in added.items():
        assert tok.token_to_id(spec["content"]) == int(idx)
    text = "<|im_start|>assistant\nHi, wörld!<|im_end|>\n<tts_pad>"
    ids = tok.encode(text).ids
    assert ids[0] == 151644 and ids[-1] == 151671 and 151645 in ids
    assert ids[1:3] == [real_vocab["a"], real_vocab["s"]]  # single bytes at their real Qwen2 ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    processor_tok = official_tts(path).processor.tokenizer
    assert processor_tok(text)["input_ids"] == ids


def test_cli_writes_and_refuses_non_empty(tmp_path, capsys):
    out = tmp_path / "snap"
    tok = reference("configs", "text-tokenizer-qwen2")
    assert (
        main(
            ["random-checkpoint", str(out), "--kind", "custom_voice", "--layout", "1.7b", "--tokenizer", tok]
        )
        == 0
    )
    assert "noise, not speech" in capsys.readouterr().out
    assert (out / "vocab.json").is_file() and (out / "merges.txt").is_file()
    assert main(["random-checkpoint", str(out)]) == 2
    assert main(["random-checkpoint", str(tmp_path / "z"), "--tokenizer", str(tmp_path)]) == 2
    assert main(["random-checkpoint", str(out), "--overwrite", "--seed", "3"]) == 0
    assert ModelConfig.from_dir(str(out)).tts_model_type == "base"
