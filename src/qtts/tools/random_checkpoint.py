"""Random-weight Qwen3-TTS snapshots in the real Hugging Face layout (for tests and benchmarks).

``write_random_checkpoint(out, size, kind, layout, seed, tokenizer_dir, dtype)`` writes::

    config.json  generation_config.json  preprocessor_config.json  tokenizer_config.json
    configuration.json  model.safetensors  (vocab.json + merges.txt | tokenizer.json)
    speech_tokenizer/{config.json, model.safetensors, preprocessor_config.json, configuration.json}

Configs start from the real published ones (embedded under ``qtts/data/configs``). ``full``
keeps every real dimension; ``mid`` keeps every real width (hidden sizes, head_dim 128, mrope
sections, speaker encoder, Mimi encoder and vocoder convs) with only 2 talker layers, 1 predictor
layer and 2 layers per codec transformer (0.6b ~2.3 GB, 1.7b ~3.0 GB fp32, most of it the real
151936 x 2048 text embedding); ``tiny`` shrinks widths and layers but keeps every id, the codec
vocab (3072), the predictor vocab (2048), the 16 code groups, the text vocab (151936) and the
1920-sample frame. The tiny 1.7b layout has talker hidden != predictor hidden, so
``small_to_mtp_projection`` exists, like the real 1.7B. ``natural_eos`` wires an EOS clock into
the talker so greedy generation stops by itself (see :func:`qtts.tools.random_weights.eos_clock_edits`).

Weights are random but non-degenerate: norm weights 1 + N(0, 0.1) (so parity tests see
a missing or misplaced norm weight), norm biases N(0, 0.02), LayerScale at its configured init,
ConvNeXt gamma 0.01, SnakeBeta log-params N(0, 0.1), codebooks ``embedding_sum``/``embed_sum``
N(0,1) with ``cluster_usage`` U(0.5, 1.5) and ``initialized`` 1, everything else N(0, std)
with std 0.05 (tiny) or 0.02 (mid, full); fan-in scaled weights in the speech-tokenizer encoder and
decoder, so codes and audio vary with their inputs. Tensors are generated one at a time and streamed to disk,
so a full 0.6B snapshot needs little more memory than its largest tensor.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil

from ..config import ModelConfig, SpeechTokenizerConfig
from ..errors import InputError
from ..files import temp_dir_beside

log = logging.getLogger(__name__)

SIZES = ("tiny", "mid", "full")
KINDS = ("base", "custom_voice", "voice_design", "forced_aligner")  # forced_aligner: qtts.tools.random_aligner
LAYOUTS = ("0.6b", "1.7b")
DTYPES = ("float32", "bfloat16")

_REAL_NAMES = {
    ("base", "0.6b"): "Qwen3-TTS-12Hz-0.6B-Base",
    ("base", "1.7b"): "Qwen3-TTS-12Hz-1.7B-Base",
    ("custom_voice", "0.6b"): "Qwen3-TTS-12Hz-0.6B-CustomVoice",
    ("custom_voice", "1.7b"): "Qwen3-TTS-12Hz-1.7B-CustomVoice",
    ("voice_design", "1.7b"): "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
}
_CONFIG_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "configs")
_COPIED = (
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer_config.json",
    "configuration.json",
)
_ST_COPIED = ("preprocessor_config.json", "configuration.json")
# "mid": layers per stack (talker / code predictor / codec transformers). Two talker layers so a
# layer's output feeds another layer's cache; one predictor layer (its 15 heads and embeddings
# dominate its size); the codec transformers are 512 wide and cheap.
MID_TALKER_LAYERS, MID_PREDICTOR_LAYERS, MID_CODEC_LAYERS = 2, 1, 2


def real_config_dir(name: str) -> str:
    """Directory of an embedded real config set, e.g. ``real_config_dir("Qwen3-TTS-12Hz-0.6B-Base")``."""
    path = os.path.join(_CONFIG_ROOT, name)
    if not os.path.isdir(path):
        known = ", ".join(sorted(n for n in os.listdir(_CONFIG_ROOT) if not n.endswith(".md")))
        raise InputError(f"no embedded config '{name}'; known: {known}")
    return path


def real_name(kind: str, layout: str) -> str:
    """Name of the published checkpoint whose config a (kind, layout) snapshot starts from."""
    if kind not in KINDS:
        raise InputError(f"unknown kind '{kind}'; use one of {', '.join(KINDS)}")
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout '{layout}'; use one of {', '.join(LAYOUTS)}")
    if (kind, layout) not in _REAL_NAMES:
        raise InputError(
            f"kind '{kind}' exists only in the 1.7b layout (there is no 0.6B VoiceDesign checkpoint); "
            "pass --layout 1.7b"
        )
    return _REAL_NAMES[(kind, layout)]


def _load_json(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _shrink_stack(cfg: dict, hidden: int) -> None:
    """Tiny Qwen3 stack: 2 layers, 4 heads on 2 kv heads (real GQA grouping), head_dim 16."""
    cfg.update(
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    if "layer_types" in cfg:
        cfg["layer_types"] = ["full_attention"] * 2


def _few_layers(cfg: dict, n: int) -> None:
    """Keep every dimension of a stack, only ``n`` layers."""
    cfg["num_hidden_layers"] = n
    if "layer_types" in cfg:
        cfg["layer_types"] = cfg["layer_types"][:n]


def model_config_dict(size: str, kind: str, layout: str) -> dict:
    """The ``config.json`` dict of a random snapshot."""
    cfg = _load_json(os.path.join(real_config_dir(real_name(kind, layout)), "config.json"))
    if size == "full":
        return cfg
    if size == "mid":  # every real width (head_dim 128, mrope [24,20,20], speaker encoder), few layers
        _few_layers(cfg["talker_config"], MID_TALKER_LAYERS)
        _few_layers(cfg["talker_config"]["code_predictor_config"], MID_PREDICTOR_LAYERS)
        return cfg
    if size != "tiny":
        raise InputError(f"unknown size '{size}'; use one of {', '.join(SIZES)}")
    talker = cfg["talker_config"]
    hidden = 64 if layout == "1.7b" else 32  # 1.7b layout: talker wider than the predictor
    _shrink_stack(talker, hidden)
    talker["text_hidden_size"] = 32
    # mrope sections must sum to head_dim / 2; with identical t/h/w positions they do not matter.
    talker["rope_scaling"] = {
        "interleaved": True,
        "mrope_section": [4, 2, 2],
        "rope_type": "default",
        "type": "default",
    }
    _shrink_stack(talker["code_predictor_config"], 32)
    if kind == "base":
        # mel_dim stays 128 (hard-coded mel front end); Res2Net channels divisible by scale 8.
        cfg["speaker_encoder_config"] = {
            "enc_dim": hidden,
            "sample_rate": 24000,
            "mel_dim": 128,
            "enc_channels": [16, 16, 16, 16, 48],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 8,
            "enc_res2net_scale": 8,
            "enc_se_channels": 8,
        }
    return cfg


def speech_tokenizer_config_dict(size: str) -> dict:
    """The ``speech_tokenizer/config.json`` dict (identical in every real checkpoint)."""
    cfg = _load_json(
        os.path.join(real_config_dir(_REAL_NAMES[("base", "0.6b")]), "speech_tokenizer", "config.json")
    )
    if size == "full":
        return cfg
    if size == "mid":  # real widths; the conv stacks (SEANet, vocoder) are whole, transformers shortened
        _few_layers(cfg["decoder_config"], MID_CODEC_LAYERS)
        _few_layers(cfg["encoder_config"], MID_CODEC_LAYERS)
        return cfg
    dec = cfg["decoder_config"]
    dec.update(
        latent_dim=32,
        codebook_dim=16,
        hidden_size=32,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=2,
        decoder_dim=32,
        vector_quantization_hidden_dimension=16,
    )  # codebook_size 2048, 16 quantizers, upsample rates [8,5,4,3] x [2,2] = 1920 stay
    enc = cfg["encoder_config"]
    enc.update(
        hidden_size=32,
        num_filters=4,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=2,
        codebook_dim=8,
        vector_quantization_hidden_dimension=8,
        upsample_groups=32,
    )  # Mimi ratios [8,6,5,4] and 12.5 Hz frame rate stay
    return cfg


def write_random_checkpoint(
    out: str,
    size: str = "tiny",
    kind: str = "base",
    layout: str = "0.6b",
    seed: int = 0,
    tokenizer_dir: str | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
    natural_eos: bool = False,
    planted: bool = False,
) -> str:
    """Write a complete random snapshot to ``out`` (a new or empty directory); returns its path.
    ``planted``: heavy-tailed talker / predictor weights and outlier activation channels
    (:mod:`qtts.tools.planted_weights`), the structure 4-bit repairs are measured on."""
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)}")
    if size not in SIZES:
        raise InputError(f"unknown size '{size}'; use one of {', '.join(SIZES)}")
    if kind == "forced_aligner" and (natural_eos or planted):
        raise InputError("--natural-eos and --planted shape a talker; a forced_aligner checkpoint has none")
    name = real_name(kind, layout) if kind != "forced_aligner" else "Qwen3-ForcedAligner-0.6B"
    out = os.path.abspath(out)
    if os.path.exists(out) and os.listdir(out) and not overwrite:
        raise InputError(f"{out} exists and is not empty; choose a new directory or pass --force")
    if tokenizer_dir is not None:
        _check_tokenizer_dir(tokenizer_dir)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = temp_dir_beside(out, ".random.part")  # the umask's folder mode, unlike mkdtemp's 0700
    try:
        _write_all(tmp, name, size, kind, layout, seed, tokenizer_dir, dtype, (natural_eos, planted))
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_all(tmp, name, size, kind, layout, seed, tokenizer_dir, dtype, variants) -> None:
    from . import random_weights as rw

    if kind == "forced_aligner":
        from .random_aligner import write_aligner_files

        base_tok = _load_json(os.path.join(real_config_dir(_REAL_NAMES[("base", "0.6b")]), "tokenizer_config.json"))
        return write_aligner_files(tmp, size, seed, tokenizer_dir, dtype, base_tok)

    real = real_config_dir(name)
    cfg_dict = model_config_dict(size, kind, layout)
    st_dict = speech_tokenizer_config_dict(size)
    _dump(os.path.join(tmp, "config.json"), cfg_dict)
    for fname in _COPIED:
        shutil.copyfile(os.path.join(real, fname), os.path.join(tmp, fname))
    st_dir = os.path.join(tmp, "speech_tokenizer")
    os.makedirs(st_dir)
    _dump(os.path.join(st_dir, "config.json"), st_dict)
    for fname in _ST_COPIED:
        shutil.copyfile(os.path.join(real, "speech_tokenizer", fname), os.path.join(st_dir, fname))
    if tokenizer_dir is not None:
        for fname in ("vocab.json", "merges.txt"):
            shutil.copyfile(os.path.join(tokenizer_dir, fname), os.path.join(tmp, fname))
    else:
        from .standin_tokenizer import write_standin_tokenizer

        write_standin_tokenizer(tmp, _load_json(os.path.join(real, "tokenizer_config.json")))

    std = 0.05 if size == "tiny" else 0.02
    model_cfg = ModelConfig.from_dict(copy.deepcopy(cfg_dict))
    specs = rw.main_specs(model_cfg)
    natural_eos, planted = variants
    edits = rw.eos_clock_edits(model_cfg, std) if natural_eos else None
    if planted:
        from .planted_weights import compose, planted_edits

        edits = compose(planted_edits(model_cfg, seed), edits)
    rw.write_safetensors(os.path.join(tmp, "model.safetensors"), specs, seed, std, dtype, {}, edits)
    st_cfg = SpeechTokenizerConfig.from_file(os.path.join(st_dir, "config.json"))
    specs = rw.speech_tokenizer_specs(st_cfg)
    scale_init = {
        "decoder.": st_cfg.decoder_config.layer_scale_initial_scale,
        "encoder.": st_cfg.encoder_config.layer_scale_initial_scale,
    }
    rw.write_safetensors(os.path.join(st_dir, "model.safetensors"), specs, seed + 1, std, dtype, scale_init)


def _check_tokenizer_dir(path: str) -> None:
    missing = [f for f in ("vocab.json", "merges.txt") if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise InputError(
            f"--tokenizer {path}: missing {', '.join(missing)}; pass a directory with the Qwen2 "
            "vocab.json and merges.txt (any Qwen3-TTS snapshot has them), or omit --tokenizer "
            "to write a byte-level stand-in tokenizer"
        )


def _dump(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
