"""benchmarks/peer_gguf.py: our GGUF writer for the C++ peer qwentts.cpp (docs/history/performance.md, "Peer").

Runs without the peer wheel: names, metadata, quantization policy and an F32 round trip read back
with ``gguf.GGUFReader``. That the peer loads the files and reproduces qtts's greedy codes is
``benchmarks/peer_check.py`` (needs .venv-peer and a real-size checkpoint; the peer aborts on the tiny
dims), whose result docs/history/performance.md records.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import peer_gguf  # noqa: E402
import peer_gguf_layout as layout  # noqa: E402

# Every metadata key the peer's loader reads (qwentts.cpp src/*.h, *.cpp at a8a7716); a missing
# key reads as 0 / false there, so a typo would load silently and compute garbage.
TALKER_KEYS = [
    "qwen3-tts.tokenizer_type", "qwen3-tts.model_size", "qwen3-tts.model_type", "qwen3-tts.num_code_groups",
    *[f"qwen3-tts.{m}.{k}" for m in ("talker", "code_pred") for k in (
        "embedding_length", "feed_forward_length", "block_count", "attention.head_count",
        "attention.head_count_kv", "attention.key_length", "vocab_size", "rope.freq_base",
        "attention.layer_norm_rms_epsilon")],
    "qwen3-tts.talker.rope.mrope_section", "qwen3-tts.talker.rope.mrope_interleaved",
    "qwen3-tts.spk_enc.embedding_length", "qwen3-tts.spk_enc.sample_rate",
    *[f"qwen3-tts.codec.{k}" for k in ("pad_id", "bos_id", "eos_id", "think_id", "nothink_id", "think_bos_id",
                                       "think_eos_id", "language_names", "language_ids")],
    *[f"qwen3-tts.text.{k}_id" for k in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos")],
    *[f"generation.{k}" for k in ("do_sample", "top_k", "top_p", "temperature", "repetition_penalty",
                                  "subtalker_do_sample", "subtalker_top_k", "subtalker_top_p",
                                  "subtalker_temperature", "max_new_tokens")],
    "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
]  # fmt: skip
CODEC_KEYS = [f"qwen3-tts-tokenizer.{k}" for k in (
    "decoder.codebook_dim_internal", "decoder.codebook_size", "decoder.head_dim", "decoder.hidden_size",
    "decoder.intermediate_size", "decoder.latent_dim", "decoder.num_attention_heads", "decoder.num_hidden_layers",
    "decoder.num_key_value_heads", "decoder.num_quantizers", "decoder.num_semantic_quantizers",
    "decoder.rms_norm_eps", "decoder.rope_theta", "decoder.sliding_window", "decoder.vector_quantization_hidden_dim",
    "encoder.codebook_size", "encoder.compress", "encoder.head_dim", "encoder.hidden_size",
    "encoder.intermediate_size", "encoder.kernel_size", "encoder.last_kernel_size", "encoder.norm_eps",
    "encoder.num_attention_heads", "encoder.num_filters", "encoder.num_hidden_layers", "encoder.num_key_value_heads",
    "encoder.residual_kernel_size", "encoder.rope_theta", "encoder.upsampling_ratios",
    "encoder.vector_quantization_hidden_dim")]  # fmt: skip


def _mapped(snapshot: str):
    talker = layout.mapped_tensors(
        layout.read_safetensors(_p(snapshot, "model.safetensors")), layout.compile_rules(layout.TALKER_RULES)
    )
    cfg = json.loads(open(_p(snapshot, "speech_tokenizer", "config.json")).read())
    acoustic = cfg["encoder_valid_num_quantizers"] - cfg["encoder_config"]["num_semantic_quantizers"]
    codec = layout.mapped_tensors(
        layout.read_safetensors(_p(snapshot, "speech_tokenizer", "model.safetensors")),
        layout.compile_rules(layout.CODEC_RULES),
        lambda side, i: side != "acoustic" or i < acoustic,
    )
    return dict(talker), dict(codec), len(talker), len(codec)


def _p(*parts):
    from pathlib import Path

    return Path(os.path.join(*parts))


@pytest.mark.parametrize("kind,lay", [("base", "0.6b"), ("custom_voice", "1.7b")])
def test_every_checkpoint_tensor_gets_one_gguf_name(tiny_snapshot, kind, lay):
    snap = tiny_snapshot(kind=kind, layout=lay)
    talker, codec, n_talker, n_codec = _mapped(snap)
    assert len(talker) == n_talker and len(codec) == n_codec  # no two keys share a name
    cfg = json.loads(open(_p(snap, "config.json")).read())["talker_config"]
    for i in range(cfg["num_hidden_layers"]):
        for s in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                  "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down"):  # fmt: skip
            assert f"talker.blk.{i}.{s}.weight" in talker
    assert {f"code_pred.lm_head.{i}.weight" for i in range(15)} <= set(talker)
    assert {f"code_pred.codec_embd.{i}.weight" for i in range(15)} <= set(talker)
    assert ("code_pred.mtp_proj.weight" in talker) == (lay == "1.7b")  # 1.7B: talker wider than predictor
    assert any(k.startswith("spk_enc.") for k in talker) == (kind == "base")
    books = sorted(k for k in codec if k.endswith(".codebook"))
    assert books == sorted(["tok_dec.vq_first.0.codebook", "tok_enc.vq_semantic.0.codebook"]
                           + [f"tok_dec.vq_rest.{i}.codebook" for i in range(15)]
                           + [f"tok_enc.vq_acoustic.{i}.codebook" for i in range(15)])  # fmt: skip
    assert not [k for k in codec if k.startswith("tok_dec.vq_") and "input_proj" in k]  # unused to decode
    assert {f"tok_dec.dec.{b}.res.{r}.conv1.weight" for b in (1, 2, 3, 4) for r in (0, 1, 2)} <= set(codec)


def test_an_unknown_checkpoint_key_is_an_error():
    with pytest.raises(ValueError, match="talker.model.extra_head.weight"):
        layout.mapped_tensors({"talker.model.extra_head.weight": np.zeros((2, 2), np.float32)},
                              layout.compile_rules(layout.TALKER_RULES))  # fmt: skip


def test_codebooks_are_the_vocoder_tables(tiny_snapshot):
    from qtts.weights import load_checkpoint

    snap = tiny_snapshot()
    _, codec, _, _ = _mapped(snap)
    quantizer = load_checkpoint(snap, components=("decoder",)).speech_tokenizer.decoder.quantizer
    for side, i in (("first", 0), ("rest", 0), ("rest", 14)):
        want = getattr(quantizer, f"rvq_{side}").vq.layers[i]._codebook.table().detach().numpy()
        np.testing.assert_allclose(codec[f"tok_dec.vq_{side}.{i}.codebook"], want, rtol=1e-6)


def test_quantization_policy():
    block = {"Q8_0": 32, "Q4_K": 256, "Q6_K": 256}.get
    pick = lambda name, shape, v="Q4_K_M": peer_gguf.pick_type(name, shape, v, block)  # noqa: E731
    assert pick("talker.blk.0.attn_q.weight", (2048, 1024)) == "Q4_K"
    assert pick("talker.blk.0.attn_q.weight", (2048, 1024), "Q8_0") == "Q8_0"
    assert pick("talker.text_embd.weight", (151936, 2048)) == "Q6_K"
    assert pick("code_pred.codec_embd.3.weight", (2048, 1024)) == "Q6_K"
    assert pick("talker.blk.0.attn_norm.weight", (1024,)) == "F32"
    assert pick("tok_dec.vq_rest.2.codebook", (2048, 256)) == "F32"
    assert pick("tok_enc.vq_semantic.output_proj.weight", (512, 256, 1)) == "F32"
    assert pick("spk_enc.fc.weight", (1024, 3072, 1)) == "F32"
    assert pick("tok_dec.dec.1.conv_t.weight", (1536, 768, 16)) == "F16"  # 16 taps: no Q4_K block fits
    assert pick("tok_dec.dec.1.conv_t.weight", (1536, 768, 16), "Q8_0") == "F16"
    assert pick("tok_dec.pre_tfm.blk.0.ffn_up.weight", (1024, 512)) == "Q4_K"
    assert pick("tok_enc.blk.0.attn_q.weight", (512, 200)) == "F16"  # rows of 200: not a 256 multiple
    assert pick("talker.blk.0.attn_q.weight", (2048, 1024), "F32") == "F32"
    assert pick("tok_dec.upsample.0.gamma", (1, 1024)) == "F32"  # ggml counts [1, n] as 1-D


def test_f32_gguf_round_trip(tiny_snapshot, tmp_path, monkeypatch):
    from gguf import GGUFReader

    full_bpe = layout.bpe_kv  # GGUFReader needs ~1 min for 300k strings: keep 1000 of each array
    monkeypatch.setattr(layout, "bpe_kv", lambda d: [(k, v[:1000] if kind == "arr" else v, kind)
                                                      for k, v, kind in full_bpe(d)])  # fmt: skip
    snap = tiny_snapshot()
    talker_path, codec_path = peer_gguf.convert(_p(snap), tmp_path, "F32")
    talker, codec, _, _ = _mapped(snap)
    cfg = json.loads(open(_p(snap, "config.json")).read())["talker_config"]
    for path, tensors, keys in ((talker_path, talker, TALKER_KEYS), (codec_path, codec, CODEC_KEYS)):
        reader = GGUFReader(str(path))
        assert not [k for k in keys if reader.get_field(k) is None]
        got = {t.name: t for t in reader.tensors}
        assert set(got) == set(tensors)
        for name, arr in tensors.items():  # ggml's ne is the numpy shape reversed
            assert list(got[name].shape) == list(reversed(arr.shape)), name
            np.testing.assert_array_equal(np.asarray(got[name].data).reshape(arr.shape), arr, err_msg=name)
        mine = layout.gguf_kv(path, set(keys))  # our quick reader (bench_peer.py) agrees with gguf's
        for key in keys:
            assert mine[key] == reader.get_field(key).contents(), key
    reader = GGUFReader(str(talker_path))
    assert reader.get_field("general.architecture").contents() == "qwen3-tts"
    assert reader.get_field("qwen3-tts.talker.block_count").contents() == cfg["num_hidden_layers"]
    assert reader.get_field("qwen3-tts.codec.eos_id").contents() == cfg["codec_eos_token_id"]
    assert reader.get_field("qwen3-tts.talker.rope.mrope_interleaved").contents() is True


def test_bpe_payload_is_the_real_tokenizer():
    from conftest import REAL_TOKENIZER_DIR

    kv = {k: v for k, v, _ in layout.bpe_kv(_p(REAL_TOKENIZER_DIR))}
    vocab = json.loads(open(_p(REAL_TOKENIZER_DIR, "vocab.json"), encoding="utf-8").read())
    tokens, types, merges = (
        kv["tokenizer.ggml.tokens"],
        kv["tokenizer.ggml.token_type"],
        kv["tokenizer.ggml.merges"],
    )
    assert len(tokens) == len(types) and len(merges) > 150_000 and all(" " in m for m in merges)
    assert all(tokens[i] == t for t, i in list(vocab.items())[:2000])
    assert tokens[151671] == "<tts_pad>" and types[151671] == 4  # special tokens are user-defined (4)
    assert kv["tokenizer.ggml.model"] == "gpt2"


def test_a_tokenizer_without_merges_is_a_clear_error(tiny_snapshot, tmp_path):
    snap = tiny_snapshot(real_tokenizer=False)  # byte-level stand-in tokenizer.json, no merges.txt
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        peer_gguf.convert(_p(snap), tmp_path, "F32")
