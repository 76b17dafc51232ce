"""The GGUF layout of the C++ peer qwentts.cpp: tensor names, metadata keys, BPE payload.

Pure data + numpy (no ``gguf``, no peer wheel), so the name mapping is testable anywhere; the
writer is ``benchmarks/peer_gguf.py``. The layout is the one the peer's loader reads, as documented
in qwentts.cpp ``docs/ARCHITECTURE.md`` ("GGUF layout") and its ``src/*-weights.h``; the code is ours.
Every checkpoint tensor must match exactly one rule (unknown keys are an error, as in our loader).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

RVQ_EPS = 1e-5  # EuclideanCodebook: embedding_sum / cluster_usage.clamp(min=1e-5)

_LM = {  # Qwen3 decoder layer: HF suffix -> GGUF suffix (talker, code predictor, codec transformer)
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn_layer_scale.scale": "attn_scale", "mlp_layer_scale.scale": "ffn_scale",
}  # fmt: skip
_ENC_LM = {  # Mimi encoder transformer (LayerNorm with bias, fc1/fc2 MLP)
    "input_layernorm.(weight|bias)": r"attn_norm.\2", "post_attention_layernorm.(weight|bias)": r"ffn_norm.\2",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn_layer_scale.scale": "attn_scale", "mlp_layer_scale.scale": "ffn_scale",
    "mlp.fc1.weight": "ffn_up.weight", "mlp.fc2.weight": "ffn_down.weight",
}  # fmt: skip
WB = "(weight|bias)"


def _layer_rules(src: str, dst: str, table: dict) -> list:
    """One rule per layer suffix: ``{src}.<i>.<hf suffix>`` -> ``{dst}.<i>.<gguf suffix>``."""
    rules = []
    for hf, gg in table.items():
        suffix = hf.replace(".", "\\.")  # the suffixes hold only names, dots and (a|b) groups
        rules.append((rf"{src}\.(\d+)\.{suffix}", rf"{dst}.\1.{gg}"))
    return rules


TALKER_RULES = [
    *_layer_rules(r"talker\.model\.layers", "talker.blk", _LM),
    *_layer_rules(r"talker\.code_predictor\.model\.layers", "code_pred.blk", _LM),
    (r"talker\.model\.codec_embedding\.weight", "talker.codec_embd.weight"),
    (r"talker\.model\.text_embedding\.weight", "talker.text_embd.weight"),
    (r"talker\.model\.norm\.weight", "talker.output_norm.weight"),
    (r"talker\.codec_head\.weight", "talker.codec_head.weight"),
    (rf"talker\.text_projection\.linear_fc([12])\.{WB}", r"talker.text_proj.fc\1.\2"),
    (r"talker\.code_predictor\.model\.norm\.weight", "code_pred.output_norm.weight"),
    (rf"talker\.code_predictor\.small_to_mtp_projection\.{WB}", r"code_pred.mtp_proj.\1"),
    (r"talker\.code_predictor\.model\.codec_embedding\.(\d+)\.weight", r"code_pred.codec_embd.\1.weight"),
    (r"talker\.code_predictor\.lm_head\.(\d+)\.weight", r"code_pred.lm_head.\1.weight"),
    (rf"speaker_encoder\.blocks\.0\.conv\.{WB}", r"spk_enc.conv0.\1"),
    (rf"speaker_encoder\.(asp\.conv|mfa|fc)(?:\.conv)?\.{WB}", r"spk_enc.\1.\2"),
    (rf"speaker_encoder\.asp\.tdnn\.conv\.{WB}", r"spk_enc.asp.tdnn.\1"),
    (rf"speaker_encoder\.blocks\.(\d+)\.res2net_block\.blocks\.(\d+)\.conv\.{WB}", r"spk_enc.blk.\1.res2net.\2.\3"),
    (rf"speaker_encoder\.blocks\.(\d+)\.se_block\.(conv[12])\.{WB}", r"spk_enc.blk.\1.se.\2.\3"),
    (rf"speaker_encoder\.blocks\.(\d+)\.(tdnn[12])\.conv\.{WB}", r"spk_enc.blk.\1.\2.\3"),
]  # fmt: skip

CODEBOOK = "<codebook>"  # embedding_sum / cluster_usage pairs, fused into one F32 table
CODEC_RULES = [
    (rf"decoder\.pre_conv\.conv\.{WB}", r"tok_dec.pre_conv.\1"),
    (rf"decoder\.pre_transformer\.(input_proj|output_proj)\.{WB}", r"tok_dec.pre_tfm.\1.\2"),
    (r"decoder\.pre_transformer\.norm\.weight", "tok_dec.pre_tfm.norm.weight"),
    *_layer_rules(r"decoder\.pre_transformer\.layers", "tok_dec.pre_tfm.blk", _LM),
    (rf"decoder\.upsample\.(\d+)\.0\.conv\.{WB}", r"tok_dec.upsample.\1.conv.\2"),
    (rf"decoder\.upsample\.(\d+)\.1\.dwconv\.conv\.{WB}", r"tok_dec.upsample.\1.dwconv.\2"),
    (rf"decoder\.upsample\.(\d+)\.1\.(norm|pwconv1|pwconv2)\.{WB}", r"tok_dec.upsample.\1.\2.\3"),
    (r"decoder\.upsample\.(\d+)\.1\.gamma", r"tok_dec.upsample.\1.gamma"),
    (rf"decoder\.decoder\.([06])\.conv\.{WB}", r"tok_dec.dec.\1.conv.\2"),
    (r"decoder\.decoder\.5\.(alpha|beta)", r"tok_dec.dec.5.snake.\1"),
    (r"decoder\.decoder\.(\d)\.block\.0\.(alpha|beta)", r"tok_dec.dec.\1.snake.\2"),
    (rf"decoder\.decoder\.(\d)\.block\.1\.conv\.{WB}", r"tok_dec.dec.\1.conv_t.\2"),
    *[(rf"decoder\.decoder\.(\d)\.block\.{j}\.(act[12])\.(alpha|beta)", rf"tok_dec.dec.\1.res.{j - 2}.\2.\3")
      for j in (2, 3, 4)],
    *[(rf"decoder\.decoder\.(\d)\.block\.{j}\.(conv[12])\.conv\.{WB}", rf"tok_dec.dec.\1.res.{j - 2}.\2.\3")
      for j in (2, 3, 4)],
    (r"decoder\.quantizer\.r(vq_first|vq_rest)\.output_proj\.weight", r"tok_dec.\1.output_proj.weight"),
    (r"decoder\.quantizer\.rvq_(first|rest)\.input_proj\.weight", None),  # = the encoder's; unused to decode
    (r"decoder\.quantizer\.r(vq_first|vq_rest)\.vq\.layers\.(\d+)\._codebook\.(embedding_sum|cluster_usage)",
     CODEBOOK),
    (rf"encoder\.encoder\.layers\.(\d+)\.conv\.{WB}", r"tok_enc.conv.\1.\2"),
    (rf"encoder\.encoder\.layers\.(\d+)\.block\.(\d+)\.conv\.{WB}", r"tok_enc.res.\1.blk.\2.\3"),
    *_layer_rules(r"encoder\.encoder_transformer\.layers", "tok_enc.blk", _ENC_LM),
    (rf"encoder\.downsample\.conv\.{WB}", r"tok_enc.downsample.\1"),
    (r"encoder\.quantizer\.(semantic|acoustic)_residual_vector_quantizer\.(input_proj|output_proj)\.weight",
     r"tok_enc.vq_\1.\2.weight"),
    (r"encoder\.quantizer\.(semantic|acoustic)_residual_vector_quantizer\.layers\.(\d+)\.codebook\.initialized",
     None),
    (r"encoder\.quantizer\.(semantic|acoustic)_residual_vector_quantizer\.layers\.(\d+)\.codebook\."
     r"(embed_sum|cluster_usage)", CODEBOOK),
]  # fmt: skip


def compile_rules(rules: list) -> list:
    return [(re.compile(pattern), out) for pattern, out in rules]


def gguf_name(name: str, rules: list):
    """(GGUF name or None = dropped or CODEBOOK, match) for an HF key; KeyError names an unknown key."""
    for pattern, out in rules:
        m = pattern.fullmatch(name)
        if m:
            return (m.expand(out) if out not in (None, CODEBOOK) else out), m
    raise KeyError(name)


# ------------------------------------------------------------------------------------- reading


def read_safetensors(path: Path) -> dict:
    """name -> numpy array, memory-mapped (BF16 widened to F32 on access)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    base, out = 8 + n, {}
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in kinds:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}; expected F32, F16 or BF16")
        lo, hi = info["data_offsets"]
        arr = raw[base + lo : base + hi].view(kinds[info["dtype"]]).reshape(info["shape"])
        out[name] = (arr.astype(np.uint32) << 16).view(np.float32) if info["dtype"] == "BF16" else arr
    return out


def mapped_tensors(tensors: dict, rules: list, keep_codebooks=None) -> list:
    """[(gguf name, array)] in source order; codebook pairs fused; unknown keys -> ValueError."""
    out, books, unknown = [], {}, []
    for name, arr in tensors.items():
        try:
            new, m = gguf_name(name, rules)
        except KeyError:
            unknown.append(name)
            continue
        if new == CODEBOOK:
            side, layer, field = m.groups()
            if keep_codebooks is None or keep_codebooks(side, int(layer)):
                books.setdefault((side, int(layer)), {})["sum" if field.endswith("sum") else "usage"] = arr
        elif new is not None:
            out.append((new, arr))
    if unknown:
        raise ValueError(f"{len(unknown)} checkpoint tensors have no GGUF name: {unknown[:5]}")
    for (side, layer), pair in sorted(books.items()):
        if set(pair) != {"sum", "usage"}:
            raise ValueError(f"codebook {side}.{layer} lacks one of embedding_sum / cluster_usage")
        usage = np.maximum(np.asarray(pair["usage"], np.float32), RVQ_EPS)
        out.append((_codebook_name(side, layer), np.asarray(pair["sum"], np.float32) / usage[:, None]))
    return out


def _codebook_name(side: str, layer: int) -> str:
    """Decoder sides arrive as 'vq_first' / 'vq_rest', encoder sides as 'semantic' / 'acoustic'."""
    if side.startswith("vq_"):
        return f"tok_dec.{side}.{layer}.codebook"
    return f"tok_enc.vq_{side}.{layer}.codebook"


# ------------------------------------------------------------------------------------- metadata

_LM_KV = {"embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
          "block_count": "num_hidden_layers", "attention.head_count": "num_attention_heads",
          "attention.head_count_kv": "num_key_value_heads", "attention.key_length": "head_dim",
          "vocab_size": "vocab_size", "context_length": "max_position_embeddings"}  # fmt: skip
_CODEC_SPECIALS = {"pad_id": "codec_pad_id", "bos_id": "codec_bos_id", "eos_id": "codec_eos_token_id",
                   "think_id": "codec_think_id", "nothink_id": "codec_nothink_id",
                   "think_bos_id": "codec_think_bos_id", "think_eos_id": "codec_think_eos_id"}  # fmt: skip
_GEN = {"do_sample": ("do_sample", "bool"), "top_k": ("top_k", "u32"), "top_p": ("top_p", "f32"),
        "temperature": ("temperature", "f32"), "repetition_penalty": ("repetition_penalty", "f32"),
        "subtalker_dosample": ("subtalker_do_sample", "bool"), "subtalker_top_k": ("subtalker_top_k", "u32"),
        "subtalker_top_p": ("subtalker_top_p", "f32"), "subtalker_temperature": ("subtalker_temperature", "f32"),
        "max_new_tokens": ("max_new_tokens", "u32")}  # fmt: skip


def _lm_kv(prefix: str, cfg: dict) -> list:
    kv = [(f"{prefix}.{k}", cfg[v], "u32") for k, v in _LM_KV.items()]
    return kv + [(f"{prefix}.rope.freq_base", cfg["rope_theta"], "f32"),
                 (f"{prefix}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"], "f32")]  # fmt: skip


def talker_kv(cfg: dict, gen: dict, tok_dir: Path) -> list:
    """[(key, value, kind)] of the talker GGUF: hyper-parameters, special ids, sampling, BPE."""
    t, p = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    kv = [("general.name", f"Qwen3-TTS-12Hz-{cfg['tts_model_size']}-{cfg['tts_model_type']}", "str"),
          ("qwen3-tts.tokenizer_type", cfg["tokenizer_type"], "str"), ("qwen3-tts.model_size", cfg["tts_model_size"], "str"),
          ("qwen3-tts.model_type", cfg["tts_model_type"], "str"), ("qwen3-tts.num_code_groups", t["num_code_groups"], "u32")]  # fmt: skip
    kv += _lm_kv("qwen3-tts.talker", t) + _lm_kv("qwen3-tts.code_pred", p)
    kv += [
        (f"qwen3-tts.talker.{k}", t[k], "u32")
        for k in ("text_vocab_size", "text_hidden_size", "position_id_per_seconds")
    ]
    rope = t.get("rope_scaling") or {}
    if "mrope_section" in rope:
        kv += [("qwen3-tts.talker.rope.mrope_section", [int(x) for x in rope["mrope_section"]], "arr"),
               ("qwen3-tts.talker.rope.mrope_interleaved", bool(rope.get("interleaved", False)), "bool")]  # fmt: skip
    spk = cfg.get("speaker_encoder_config")
    if spk is not None:
        kv += [("qwen3-tts.spk_enc.embedding_length", spk["enc_dim"], "u32"),
               ("qwen3-tts.spk_enc.sample_rate", spk["sample_rate"], "u32")]  # fmt: skip
    kv += [(f"qwen3-tts.codec.{k}", t[v], "u32") for k, v in _CODEC_SPECIALS.items()]
    langs = t.get("codec_language_id") or {}
    kv += [("qwen3-tts.codec.language_names", list(langs), "arr"),
           ("qwen3-tts.codec.language_ids", [int(v) for v in langs.values()], "arr")]  # fmt: skip
    speakers = t.get("spk_id") or {}
    if speakers:
        dialect = t.get("spk_is_dialect") or {}
        kv += [("qwen3-tts.codec.speaker_names", list(speakers), "arr"),
               ("qwen3-tts.codec.speaker_ids", [int(v) for v in speakers.values()], "arr"),
               ("qwen3-tts.codec.speaker_dialects", [d if isinstance(d := dialect.get(s), str) else "" for s in speakers], "arr")]  # fmt: skip
    kv += [
        (f"qwen3-tts.text.{k}_id", cfg[f"{k}_token_id"], "u32")
        for k in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos")
    ]
    kv += [(f"generation.{key}", gen[k], kind) for k, (key, kind) in _GEN.items() if k in gen]
    return kv + bpe_kv(tok_dir)


def bpe_kv(tok_dir: Path) -> list:
    """The Qwen2 byte-level BPE as GGUF ``tokenizer.ggml.*`` arrays (the peer rejects a GGUF without merges)."""
    missing = [
        f for f in ("vocab.json", "merges.txt", "tokenizer_config.json") if not (tok_dir / f).is_file()
    ]
    if missing:
        raise FileNotFoundError(f"{tok_dir} lacks {', '.join(missing)}: the peer needs the real BPE vocab and merges; "
                                "pass --tokenizer tests/data/reference/configs/text-tokenizer-qwen2")  # fmt: skip
    vocab = json.loads((tok_dir / "vocab.json").read_text(encoding="utf-8"))
    added = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8")).get(
        "added_tokens_decoder", {}
    )
    size = 1 + max([*vocab.values(), *(int(i) for i in added)])
    tokens, types = [f"<|unused-{i}|>" for i in range(size)], [5] * size  # 1 normal, 4 user-defined, 5 unused
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, 1
    for i, info in added.items():
        tokens[int(i)], types[int(i)] = info["content"], 4
    merges = [ln for ln in (tok_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
              if ln and not ln.startswith("#")]  # fmt: skip
    if not merges:
        raise ValueError(f"{tok_dir}/merges.txt has no merges")
    return [("tokenizer.ggml.model", "gpt2", "str"), ("tokenizer.ggml.tokens", tokens, "arr"),
            ("tokenizer.ggml.token_type", types, "arr"), ("tokenizer.ggml.merges", merges, "arr"),
            ("tokenizer.ggml.eos_token_id", 151643, "u32")]  # fmt: skip


def codec_kv(cfg: dict, codebook_dim: int) -> list:
    """[(key, value, kind)] of the codec GGUF (speech tokenizer config.json)."""
    kv = [("general.name", "Qwen3-TTS-Tokenizer-12Hz", "str")]
    kv += [(f"qwen3-tts-tokenizer.{k}", cfg[k], "u32") for k in ("input_sample_rate", "output_sample_rate",
           "decode_upsample_rate", "encode_downsample_rate", "encoder_valid_num_quantizers")]  # fmt: skip
    for side, floats in (("decoder", ("rms_norm_eps", "rope_theta", "layer_scale_initial_scale")),
                         ("encoder", ("norm_eps", "rope_theta", "layer_scale_initial_scale"))):  # fmt: skip
        for k, v in cfg[f"{side}_config"].items():
            key = f"qwen3-tts-tokenizer.{side}.{k.replace('_dimension', '_dim')}"
            if k in floats:
                kv.append((key, float(v), "f32"))
            elif isinstance(v, list) and k in ("upsample_rates", "upsampling_ratios"):
                kv.append((key, [int(x) for x in v], "arr"))
            elif isinstance(v, int) and not isinstance(v, bool) and k != "max_position_embeddings":
                kv.append((key, v, "u32"))
    return kv + [("qwen3-tts-tokenizer.decoder.codebook_dim_internal", codebook_dim, "u32")]


# ------------------------------------------------------------------------------------- reading back

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip


def gguf_kv(path: Path, wanted: set) -> dict:
    """The ``wanted`` metadata values of a GGUF file; stops reading once all are found.

    (``gguf.GGUFReader`` parses every field first: ~1 min for the 300k-string BPE arrays.)
    """
    out: dict = {}
    with open(path, "rb") as fh:
        magic, _version, _n_tensors, n_kv = struct.unpack("<4sIQQ", fh.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        for _ in range(n_kv):
            if wanted <= set(out):
                break
            key = _gguf_str(fh)
            (vtype,) = struct.unpack("<I", fh.read(4))
            out[key] = _gguf_value(fh, vtype)
    return {k: v for k, v in out.items() if k in wanted}


def _gguf_str(fh) -> str:
    (n,) = struct.unpack("<Q", fh.read(8))
    return fh.read(n).decode("utf-8")


def _gguf_value(fh, vtype: int):
    if vtype == 8:
        return _gguf_str(fh)
    if vtype == 9:
        (etype, n) = struct.unpack("<IQ", fh.read(12))
        return [_gguf_value(fh, etype) for _ in range(n)]
    fmt = _SCALARS[vtype]
    return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]
