"""Checkpoint loading: strict key report, shapes, dtypes, shards, hub-id resolution and offline errors."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from qtts.errors import ConfigError, InputError
from qtts.weights import load_checkpoint, load_tensors, resolve_snapshot

HUB_ID = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"


def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def test_fp32_load_is_complete_and_matches_files(tiny_snapshot):
    path = tiny_snapshot()
    ckpt = load_checkpoint(path)
    assert ckpt.path == path and ckpt.config.tts_model_type == "base"
    files = load_file(os.path.join(path, "model.safetensors"))
    state = ckpt.model.state_dict()
    assert set(state) == set(files)
    for k, v in files.items():
        assert torch.equal(state[k], v), k
    st_files = load_file(os.path.join(path, "speech_tokenizer", "model.safetensors"))
    assert set(ckpt.speech_tokenizer.state_dict()) == set(st_files)
    assert not any(p.requires_grad for p in ckpt.model.parameters())


def test_missing_and_unexpected_keys_are_listed(tiny_snapshot, tmp_path):
    path = _copy(tiny_snapshot(), tmp_path / "snap")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    removed = sorted(k for k in tensors if ".layers.1." in k and k.startswith("talker.model."))
    for k in removed:
        del tensors[k]
    tensors["talker.bogus.weight"] = torch.zeros(3)
    save_file(tensors, file)
    with pytest.raises(ConfigError) as info:
        load_checkpoint(path, components=("talker", "speaker_encoder"))
    msg = str(info.value)
    assert f"{len(removed)} missing keys" in msg and removed[0] in msg
    assert "1 unexpected keys: talker.bogus.weight" in msg and "model.safetensors" in msg


def test_wrong_shape_is_reported(tiny_snapshot, tmp_path):
    path = _copy(tiny_snapshot(), tmp_path / "snap")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    tensors["talker.codec_head.weight"] = torch.zeros(5, 7)
    save_file(tensors, file)
    with pytest.raises(ConfigError, match=r"talker\.codec_head\.weight: file \[5, 7\]"):
        load_checkpoint(path, components=("talker", "speaker_encoder"))


def test_bf16_load(tiny_snapshot):
    path = tiny_snapshot()
    ref = load_checkpoint(path, components=("talker",)).model.talker
    ckpt = load_checkpoint(path, dtype="bfloat16", speech_tokenizer_dtype=torch.float32)
    talker = ckpt.model.talker
    assert {p.dtype for p in ckpt.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in ckpt.speech_tokenizer.parameters()} == {torch.float32}
    embeds = ref.embed_text(torch.arange(6)[None])
    with torch.no_grad():
        want, _, _ = ref(embeds, 0, ref.new_cache(8))
        got, _, cache = talker(embeds.bfloat16(), 0, talker.new_cache(8))
    assert cache.dtype == torch.bfloat16 and got.dtype == torch.bfloat16
    err = (got.float() - want).abs().max().item()
    assert err < 0.05 * want.abs().max().item(), err


def test_components_subset(tiny_snapshot):
    ckpt = load_checkpoint(tiny_snapshot(), components=("decoder",))
    assert ckpt.model is None and ckpt.speech_tokenizer.encoder is None
    assert ckpt.speech_tokenizer.decoder is not None
    ckpt = load_checkpoint(tiny_snapshot(), components=("talker",))
    assert ckpt.model.speaker_encoder is None and ckpt.speech_tokenizer is None
    with pytest.raises(InputError, match="unknown checkpoint roots"):
        load_checkpoint(tiny_snapshot(), components=("vocoder",))


def test_sharded_checkpoint(tiny_snapshot, tmp_path):
    path = _copy(tiny_snapshot(), tmp_path / "snap")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: tensors[k] for k in ks}, os.path.join(path, name))
        weight_map.update({k: name for k in ks})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    loaded = load_tensors(path)
    assert set(loaded) == set(tensors) and all(torch.equal(loaded[k], tensors[k]) for k in keys)
    load_checkpoint(path, components=("talker", "speaker_encoder"))


def _fake_hf_cache(root, snapshot: str, repo_id: str = HUB_ID, commit: str = "0123456789abcdef") -> str:
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    shutil.copytree(snapshot, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return str(snap)


def test_hub_id_resolves_from_local_cache(tiny_snapshot, tmp_path, monkeypatch):
    snap = _fake_hf_cache(tmp_path / "hub", tiny_snapshot())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert os.path.realpath(resolve_snapshot(HUB_ID)) == os.path.realpath(snap)
    ckpt = load_checkpoint(HUB_ID, components=("talker",))
    assert os.path.realpath(ckpt.path) == os.path.realpath(snap)


def test_offline_hub_miss_says_how_to_get_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError) as info:
        resolve_snapshot(HUB_ID)
    msg = str(info.value)
    assert HUB_ID in msg and f"hf download {HUB_ID}" in msg and "HF_HUB_OFFLINE" in msg


def test_missing_local_dir_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no such snapshot directory"):
        resolve_snapshot(str(tmp_path / "a" / "b" / "c"))
    with pytest.raises(InputError, match="dtype"):
        load_checkpoint(str(tmp_path), dtype="int8")
