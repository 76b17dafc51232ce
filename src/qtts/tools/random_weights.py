"""Tensor specs of our module trees and a streaming safetensors writer filled with random values.

Used by :mod:`qtts.tools.random_checkpoint`. The module trees are built on the meta device (no
memory), so the key set and shapes come from the same classes the loader uses.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig, SpeechTokenizerConfig
from ..weights import empty_init

_ST_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.bool: "BOOL",
}
_CHUNK = 1 << 24  # elements generated per slice of a large tensor


@dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple
    dtype: torch.dtype
    buffer: bool  # buffers (codebook statistics) keep their own dtype


def _specs(module: nn.Module) -> list[Spec]:
    buffers = {name for name, _ in module.named_buffers()}
    return [Spec(k, tuple(v.shape), v.dtype, k in buffers) for k, v in sorted(module.state_dict().items())]


def main_specs(cfg: ModelConfig) -> list[Spec]:
    from ..model.tts import Qwen3TTS

    with empty_init():
        return _specs(Qwen3TTS(cfg))


def aligner_specs(cfg) -> list[Spec]:
    """Tensors of a Qwen3-ForcedAligner (``cfg``: an :class:`~qtts.model.aligner_config.AlignerConfig`)."""
    from ..model.aligner import ForcedAlignerModel

    with empty_init():
        return _specs(ForcedAlignerModel(cfg))


def speech_tokenizer_specs(cfg: SpeechTokenizerConfig) -> list[Spec]:
    from ..model.speech_tokenizer import SpeechTokenizer

    with empty_init():
        return _specs(SpeechTokenizer(cfg))


# -- natural EOS: a "spoken after the text" clock wired into random talker weights ---------------
# Random weights never choose EOS by themselves. With ``natural_eos`` the talker input gets a
# marker channel AUDIO: +a on every codebook-0 code embedding (0..2047), -a on every text token
# but <tts_pad> (through a dedicated text-embedding column and projection unit), 0 on all else
# (control ids, speaker rows, predictor embeddings). A frame that still carries text sums to 0;
# a frame after the text is used up (it carries <tts_pad>) is +a; prefill text is -a. Attention
# head 0 of layer 0 has q = 0, so it averages over all positions so far, and reads only AUDIO;
# it is the only writer of channel CLOCK, which the codec head's EOS row reads. The EOS logit
# so grows with the frames spoken after the text ran out (and shrinks with the text length), and
# greedy decoding stops once it beats the best random code-0 logit: in every mode, some frames
# after the text is exhausted, like a real model. Every other weight stays random.
# Scales are relative to the random std (input elements are ~4 std, random logits ~std*sqrt(H)).
AUDIO, CLOCK = 0, 1  # talker residual channels
TEXT_COL, TEXT_UNIT = 0, 0  # text-embedding column and text_projection.linear_fc1 unit of the marker
EOS_AUDIO = 20.0
EOS_GAIN = 1.0
_UNIT_IN = 2.0
_SILU_UNIT = _UNIT_IN / (1.0 + math.exp(-_UNIT_IN))


def _edit(zero_rows=(), zero_cols=(), sets=()):
    """fn(w): zero rows and columns of ``w``, then set single entries ``sets`` = ((index, value), ...)."""

    def fn(w):
        for r in zero_rows:
            w[r] = 0.0
        for c in zero_cols:
            w[:, c] = 0.0
        for index, value in sets:
            w[index] = value
        return w

    return fn


def eos_clock_edits(cfg: ModelConfig, std: float) -> dict:
    """{tensor name: fn(value) -> value} wiring the EOS clock into a talker (see above)."""
    t = cfg.talker
    eos, d = t.codec_eos_token_id, t.head_dim
    audio, gain = EOS_AUDIO * std, EOS_GAIN * std * math.sqrt(t.hidden_size)
    both, pre = (AUDIO, CLOCK), "talker.model."
    edits = {
        f"{pre}codec_embedding.weight": _edit(zero_cols=both, sets=[((slice(0, 2048), AUDIO), audio)]),
        # every text token carries the marker column except <tts_pad>
        f"{pre}text_embedding.weight": _edit(sets=[((slice(None), TEXT_COL), 1.0),
                                                   ((cfg.tts_pad_token_id, TEXT_COL), 0.0)]),
        "talker.text_projection.linear_fc1.weight": _edit((TEXT_UNIT,), sets=[((TEXT_UNIT, TEXT_COL), _UNIT_IN)]),
        "talker.text_projection.linear_fc1.bias": _edit((TEXT_UNIT,)),
        "talker.text_projection.linear_fc2.weight": _edit(both, sets=[((AUDIO, TEXT_UNIT), -audio / _SILU_UNIT)]),
        "talker.text_projection.linear_fc2.bias": _edit(both),
        f"{pre}layers.0.self_attn.q_proj.weight": _edit(range(d)),  # head 0: scores 0 -> uniform average
        f"{pre}layers.0.self_attn.v_proj.weight": _edit((0,), sets=[((0, AUDIO), 1.0)]),
        f"{pre}layers.0.self_attn.o_proj.weight": _edit((CLOCK,), sets=[((CLOCK, 0), 1.0)]),
        "talker.codec_head.weight": _edit((eos,), sets=[((eos, CLOCK), gain)]),
    }  # fmt: skip
    for j in range(t.code_predictor_config.num_code_groups - 1):
        edits[f"talker.code_predictor.model.codec_embedding.{j}.weight"] = _edit(zero_cols=both)
    for i in range(t.num_hidden_layers):  # CLOCK has one writer
        edits[f"{pre}layers.{i}.mlp.down_proj.weight"] = _edit((CLOCK,))
        if i:
            edits[f"{pre}layers.{i}.self_attn.o_proj.weight"] = _edit((CLOCK,))
    return edits


def _value(spec: Spec, gen: torch.Generator, std: float, scale_init: dict) -> torch.Tensor:
    """Random values for one tensor (float32 unless a buffer has another dtype)."""
    name, shape = spec.name, spec.shape
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "initialized":
        return torch.ones(shape, dtype=spec.dtype)
    if leaf == "cluster_usage":
        return torch.rand(shape, generator=gen) + 0.5
    if leaf in ("embedding_sum", "embed_sum"):
        return torch.randn(shape, generator=gen)
    if "norm" in name and leaf == "weight":  # near 1 but not 1, so a missing/misplaced weight shows
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if "norm" in name and leaf == "bias":
        return 0.02 * torch.randn(shape, generator=gen)
    if leaf == "scale":  # LayerScale: keep the configured initial value
        init = next((v for p, v in scale_init.items() if name.startswith(p)), 0.01)
        return torch.full(shape, float(init))
    if leaf == "gamma":  # ConvNeXt layer scale (init 1e-6 would hide the branch)
        return torch.full(shape, 0.01)
    if leaf in ("alpha", "beta"):  # SnakeBeta log-parameters
        return 0.1 * torch.randn(shape, generator=gen)
    if name.startswith("decoder.") and leaf == "weight" and len(shape) >= 2:
        return _randn(shape, gen, _decoder_gain(name, shape) / math.sqrt(_decoder_fan_in(name, shape)))
    if name.startswith("encoder.") and leaf == "weight" and len(shape) >= 2:
        # speech-tokenizer encoder: fan-in scaling keeps activations O(1) through its deep
        # conv stack, so the codes vary (a flat std gives 1-3 distinct codes per codebook)
        return _randn(shape, gen, 1.5 / math.sqrt(_numel(shape[1:])))
    return _randn(shape, gen, std)


# Speech-tokenizer decoder (the vocoder): fan-in scaled weights keep every stage's activations
# O(1), so the waveform follows the codes (a flat std lets the conv biases and the SnakeBeta
# offsets swamp the signal: every code sequence then decodes to the same near-constant level).
# The 1x1 conv closing each residual unit gets a smaller gain (12 residual units in a row would
# otherwise grow the level ~60x), and the last conv sets the output level (RMS ~0.1, like speech).
_DECODER_RESIDUAL_GAIN = 0.3
_DECODER_OUTPUT_GAIN = 0.07
_TRANSPOSED = re.compile(r"^decoder\.(upsample\.\d+\.0|decoder\.\d+\.block\.1)\.conv\.weight$")


def _decoder_fan_in(name: str, shape: tuple) -> int:
    """Inputs summed per output value: ConvTranspose1d weights are [in, out, k] with stride k/2
    (decoder blocks) or k (upsample), i.e. 2 or 1 taps per input channel."""
    if _TRANSPOSED.match(name):
        return int(shape[0]) * (1 if ".upsample." in f".{name}" else 2)
    return _numel(shape[1:])


def _decoder_gain(name: str, shape: tuple) -> float:
    if shape[0] == 1:  # the output conv (1 channel)
        return _DECODER_OUTPUT_GAIN
    if name.endswith(".conv2.conv.weight"):
        return _DECODER_RESIDUAL_GAIN
    return 1.0


def _randn(shape: tuple, gen: torch.Generator, std: float) -> torch.Tensor:
    if _numel(shape) <= _CHUNK:
        return torch.randn(shape, generator=gen).mul_(std)
    out = torch.empty(shape)
    flat = out.view(-1)
    for start in range(0, flat.numel(), _CHUNK):
        n = min(_CHUNK, flat.numel() - start)
        flat[start : start + n] = torch.randn(n, generator=gen).mul_(std)
    return out


def write_safetensors(
    path: str, specs: list[Spec], seed: int, std: float, dtype: str, scale_init: dict, edits: dict | None = None
) -> None:
    """Stream random tensors for ``specs`` into a safetensors file (one tensor in memory at a time).

    Tensor ``i`` (in name order) draws from its own generator seeded with ``(seed, i)``, so values
    do not depend on the write order; ``edits`` maps names to functions applied to the values; data is written widest dtype first to keep every tensor aligned.
    """
    target = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    items = []
    for i, s in enumerate(specs):
        dt = s.dtype if s.buffer or not s.dtype.is_floating_point else target
        items.append((i, s, dt, torch.empty((), dtype=dt).element_size()))
    items.sort(key=lambda it: (-it[3], it[1].name))
    header, offset = {}, 0
    for _, spec, dt, size in items:
        nbytes = _numel(spec.shape) * size
        header[spec.name] = {
            "dtype": _ST_DTYPES[dt],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = {"format": "pt", "producer": "qtts random-checkpoint"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    gen = torch.Generator()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for i, spec, dt, _ in items:
            gen.manual_seed(int(seed) * 1_000_003 + i)
            value = _value(spec, gen, std, scale_init)
            if edits and spec.name in edits:
                value = edits[spec.name](value)
            value = value.to(dt).contiguous()
            raw = value.view(torch.int16) if dt == torch.bfloat16 else value
            fh.write(memoryview(raw.numpy()).cast("B"))  # no copy of a GB-sized tensor


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
