"""The strict, zero-copy checkpoint loader of the model modules (a local snapshot directory).

:func:`load_dir` builds our modules on the meta device and loads the safetensors tensors with
``load_state_dict(strict=True, assign=True)``: module paths are checkpoint keys, so a missing or
unexpected key is a :class:`~qtts.errors.ConfigError` naming it. Files are memory mapped
copy-on-write, so an fp32 load of an fp32 file makes no second copy of the weights. Hub ids and
other snapshot lookups are :mod:`qtts.weights` (``load_checkpoint(path_or_hub_id)``).

dtype policy: every floating tensor is loaded in the requested ``dtype``, norms and codebook
statistics included, exactly like the official ``from_pretrained(dtype=...)``; that is what
bf16 parity with the official model needs. Pass ``speech_tokenizer_dtype=torch.float32`` to
keep the speech tokenizer (vocoder and speech encoder) in fp32 while the talker runs in bf16.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError, InputError

#: checkpoint roots: module prefixes of model.safetensors (talker, speaker_encoder) and of
#: speech_tokenizer/model.safetensors (decoder, encoder); docs/design.md maps them to plan components and parts
CHECKPOINT_ROOTS = ("talker", "speaker_encoder", "decoder", "encoder")
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_ST_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class Checkpoint:
    config: ModelConfig
    model: nn.Module | None  # qtts.model.tts.Qwen3TTS (talker [+ speaker_encoder])
    speech_tokenizer: nn.Module | None  # qtts.model.speech_tokenizer.SpeechTokenizer (decoder [+ encoder])
    path: str


_INIT_FUNCS = (
    "normal_",
    "uniform_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
)


@contextlib.contextmanager
def empty_init():
    """Build modules on the meta device with ``torch.nn.init`` turned into no-ops.

    Every tensor is replaced by the checkpoint anyway; skipping init also skips the ~4 s
    one-time cost of running random init ops on the meta device.
    """
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCS}
    for name in _INIT_FUNCS:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, func in saved.items():
            setattr(nn.init, name, func)


def to_dtype(dtype) -> torch.dtype:
    """``torch.float32`` / ``"float32"`` / ``"bfloat16"`` ... -> torch dtype (InputError otherwise)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise InputError(f"unsupported dtype {dtype!r}; use float32 or bfloat16")


def _mmap_safetensors(path: str) -> dict[str, torch.Tensor]:
    """Tensors of one safetensors file, backed by a copy-on-write memory map (no copy)."""
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(mm[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        if count == 0:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        offset = base + start
        if offset % torch.empty((), dtype=dtype).element_size():  # unaligned: copy this one
            tensor = torch.frombuffer(bytearray(mm[offset : base + end]), dtype=dtype)
        else:
            tensor = torch.frombuffer(mm, dtype=dtype, count=count, offset=offset)
        out[name] = tensor.view(info["shape"])
    return out


def load_tensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, or of a directory (``model.safetensors`` or a sharded index)."""
    if os.path.isfile(path):
        return _mmap_safetensors(path)
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return _mmap_safetensors(single)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            files = sorted(set(json.load(fh)["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for name in files:
            tensors.update(_mmap_safetensors(os.path.join(path, name)))
        return tensors
    raise ConfigError(f"{path}: no model.safetensors (or model.safetensors.index.json) found")


def load_into(
    module: nn.Module, tensors: dict[str, torch.Tensor], where: str, dtype: torch.dtype
) -> nn.Module:
    """Strictly load ``tensors`` into a meta-built ``module`` (assign=True); mismatches raise ConfigError."""
    expected = module.state_dict(keep_vars=True)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ConfigError(_key_report(where, missing, unexpected))
    wrong = [
        f"{k}: file {list(tensors[k].shape)} vs model {list(expected[k].shape)}"
        for k in expected
        if tuple(tensors[k].shape) != tuple(expected[k].shape)
    ]
    if wrong:
        raise ConfigError(
            f"{where}: {len(wrong)} tensors have the wrong shape for config.json: " + "; ".join(wrong[:20])
        )
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()}
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval().requires_grad_(False)


def _key_report(where: str, missing: list[str], unexpected: list[str]) -> str:
    parts = [f"{where}: the checkpoint does not match the model built from config.json"]
    if missing:
        parts.append(
            f"{len(missing)} missing keys: " + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        )
    if unexpected:
        parts.append(
            f"{len(unexpected)} unexpected keys: "
            + ", ".join(unexpected[:20])
            + (" ..." if len(unexpected) > 20 else "")
        )
    return "; ".join(parts)


def _select(tensors: dict, drop_prefixes: list[str]) -> dict:
    return {k: v for k, v in tensors.items() if not any(k.startswith(p) for p in drop_prefixes)}


def load_dir(path: str, dtype=torch.float32, components=CHECKPOINT_ROOTS, device=None, speech_tokenizer_dtype=None,
             config: ModelConfig | None = None) -> Checkpoint:  # fmt: skip
    """Load the snapshot directory ``path``: ``config``, ``model`` (talker [+ speaker encoder]),
    ``speech_tokenizer`` (decoder [+ encoder]) of the checkpoint roots in ``components``.
    ``config``: the snapshot's config when the caller has read it already (else read here)."""
    unknown = sorted(set(components) - set(CHECKPOINT_ROOTS))
    if unknown:
        raise InputError(f"unknown checkpoint roots {unknown}; choose from {', '.join(CHECKPOINT_ROOTS)}")
    dtype = to_dtype(dtype)
    st_dtype = to_dtype(speech_tokenizer_dtype) if speech_tokenizer_dtype is not None else dtype
    want_st = "decoder" in components or "encoder" in components
    if config is None or (want_st and config.speech_tokenizer is None):
        config = ModelConfig.from_dir(path, speech_tokenizer=want_st)
    model = (
        _load_main(path, config, components, dtype)
        if "talker" in components or "speaker_encoder" in components
        else None
    )
    st = _load_speech_tokenizer(path, config, components, st_dtype) if want_st else None
    if device is not None:
        model = model.to(device) if model is not None else None
        st = st.to(device) if st is not None else None
    return Checkpoint(config=config, model=model, speech_tokenizer=st, path=path)


def _load_main(path: str, config: ModelConfig, components, dtype) -> nn.Module:
    from .tts import Qwen3TTS

    with empty_init():
        model = Qwen3TTS(config)
    drop = []
    if "talker" not in components:
        model.talker, drop = None, drop + ["talker."]
    if "speaker_encoder" not in components and model.speaker_encoder is not None:
        model.speaker_encoder, drop = None, drop + ["speaker_encoder."]
    return load_into(model, _select(load_tensors(path), drop), os.path.join(path, "model.safetensors"), dtype)


def _load_speech_tokenizer(path: str, config: ModelConfig, components, dtype) -> nn.Module:
    from .speech_tokenizer import SpeechTokenizer

    with empty_init():
        st = SpeechTokenizer(config.speech_tokenizer)
    drop = []
    for part in ("decoder", "encoder"):
        if part not in components:
            setattr(st, part, None)
            drop.append(part + ".")
    st_dir = os.path.join(path, "speech_tokenizer")
    return load_into(
        st, _select(load_tensors(st_dir), drop), os.path.join(st_dir, "model.safetensors"), dtype
    )
