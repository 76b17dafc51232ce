"""Tensor specs of our module trees and a streaming safetensors writer filled with random values.

Used by :mod:`qtts.random_checkpoint`. The module trees are built on the meta device (no
memory), so the key set and shapes come from the same classes the loader uses.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch
from torch import nn

from .config import ModelConfig, SpeechTokenizerConfig
from .weights import empty_init

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
    from .model.tts import Qwen3TTS

    with empty_init():
        return _specs(Qwen3TTS(cfg))


def speech_tokenizer_specs(cfg: SpeechTokenizerConfig) -> list[Spec]:
    from .model.speech_tokenizer import SpeechTokenizer

    with empty_init():
        return _specs(SpeechTokenizer(cfg))


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
    if name.startswith("encoder.") and leaf == "weight" and len(shape) >= 2:
        # speech-tokenizer encoder: fan-in scaling keeps activations O(1) through its deep
        # conv stack, so the codes vary (a flat std gives 1-3 distinct codes per codebook)
        return _randn(shape, gen, 1.5 / math.sqrt(_numel(shape[1:])))
    return _randn(shape, gen, std)


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
    path: str, specs: list[Spec], seed: int, std: float, dtype: str, scale_init: dict
) -> None:
    """Stream random tensors for ``specs`` into a safetensors file (one tensor in memory at a time).

    Tensor ``i`` (in name order) draws from its own generator seeded with ``(seed, i)``, so values
    do not depend on the write order; data is written widest dtype first to keep every tensor aligned.
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
            value = _value(spec, gen, std, scale_init).to(dt).contiguous()
            raw = value.view(torch.int16) if dt == torch.bfloat16 else value
            fh.write(raw.numpy().tobytes())


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
