"""Write a Qwen3-TTS checkpoint as the two GGUF files the C++ peer qwentts.cpp loads.

    .venv-peer/bin/python benchmarks/peer_gguf.py CKPT OUT_DIR --type F32 Q8_0 Q4_K_M

writes ``OUT_DIR/talker-<TYPE>.gguf`` (talker + code predictor + speaker encoder + the Qwen2 BPE
vocab and merges) and ``OUT_DIR/codec-<TYPE>.gguf`` (the 12 Hz speech tokenizer) per type. Used
by ``benchmarks/bench_peer.py``; environment: ``scripts/setup_peer_env.sh`` (``gguf`` + the peer wheel).

The layout (tensor names, metadata keys) is the one the peer's loader reads, as documented in
qwentts.cpp ``docs/ARCHITECTURE.md`` ("GGUF layout") and its ``src/*-weights.h``; this code is ours.
Quantization follows the peer's published policy, with the wheel's own ``ggml_quantize_chunk``:

* 1-D tensors (norms, biases, snake alpha/beta, layer scales), the RVQ codebooks and the
  projections around them (``tok_enc.vq_*``, ``tok_dec.vq_*``) and ``spk_enc.fc`` stay F32;
* the embedding tables (``*.codec_embd*``, ``talker.text_embd``) get Q6_K in Q4_K_M, Q8_0 in Q8_0;
* every other 2-D+ weight gets the base type (Q8_0, or Q4_K in Q4_K_M), or F16 where its rows do
  not divide the quant block (the conv kernels, rows of 1/2/3/5/7/16 taps).

The peer's quantizer also "bumps" attn_v/ffn_down of some layers in Q4_K_M, but its rule matches
HF names ("layers.", "v_proj") that the GGUF names do not contain, so it never fires; we write
what it writes. Source tensors are read memory-mapped (F32, F16 or BF16 safetensors).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_gguf_layout import (  # noqa: E402  (a sibling script module)
    CODEC_RULES,
    TALKER_RULES,
    codec_kv,
    compile_rules,
    mapped_tensors,
    read_safetensors,
    talker_kv,
)

log = logging.getLogger("peer_gguf")
_TALKER, _CODEC = compile_rules(TALKER_RULES), compile_rules(CODEC_RULES)

TYPES = ("F32", "Q8_0", "Q4_K_M")
# ggml_type ids (ggml.h; stable across releases)
GGML = {"F32": 0, "F16": 1, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}

# ------------------------------------------------------------------------------------- quantizing


class Ggml:
    """ggml_quantize_chunk / ggml_row_size from the peer wheel's own libggml-base (ctypes)."""

    def __init__(self, lib_dir: Path | None = None):
        if lib_dir is None:
            import importlib.util

            spec = importlib.util.find_spec("qwentts_cpp_cpu")
            if spec is None or not spec.submodule_search_locations:
                raise RuntimeError("quantizing needs the peer wheel: run `bash scripts/setup_peer_env.sh` "
                                   "and use .venv-peer/bin/python")  # fmt: skip
            lib_dir = Path(list(spec.submodule_search_locations)[0]) / "lib"
        lib = ctypes.CDLL(str(lib_dir / "libggml-base.so.0"))
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_blck_size.argtypes = [ctypes.c_int]
        lib.ggml_blck_size.restype = ctypes.c_int64
        lib.ggml_type_name.argtypes = [ctypes.c_int]
        lib.ggml_type_name.restype = ctypes.c_char_p
        for name, tid in GGML.items():  # the ids above must name the same types in this build
            got = lib.ggml_type_name(tid).decode()
            if got.upper() != name:
                raise RuntimeError(f"libggml type {tid} is {got}, expected {name}")
        self.lib = lib

    def block(self, qtype: str) -> int:
        return int(self.lib.ggml_blck_size(GGML[qtype]))

    def quantize(self, arr: np.ndarray, qtype: str) -> np.ndarray:
        """[rows, n] float32 -> [rows, row_bytes] uint8 in ggml's ``qtype`` layout."""
        src = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1, arr.shape[-1])
        rows, n = src.shape
        row_bytes = int(self.lib.ggml_row_size(GGML[qtype], n))
        dst = np.empty((rows, row_bytes), np.uint8)
        done = self.lib.ggml_quantize_chunk(GGML[qtype], src.ctypes.data, dst.ctypes.data, 0, rows, n, None)
        if done != dst.nbytes:
            raise RuntimeError(f"ggml_quantize_chunk wrote {done} bytes, expected {dst.nbytes}")
        return dst.reshape(*arr.shape[:-1], row_bytes)


def ggml_ndims(shape) -> int:
    """ggml_n_dims: trailing ne == 1 (leading numpy 1s) do not count."""
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return len(dims)


def pick_type(name: str, shape, variant: str, block) -> str:
    """Target type of one tensor (see the module docstring); ``block(type)`` = ggml block size."""
    if variant == "F32" or ggml_ndims(shape) < 2:
        return "F32"
    if name.startswith(("tok_enc.vq_", "tok_dec.vq_")) or name.startswith("spk_enc.fc.weight"):
        return "F32"
    if re.search(r"(\.snake|\.act[12])\.(alpha|beta)$", name):
        return "F32"
    embed = ".codec_embd" in name or ".text_embd" in name
    target = {"Q8_0": "Q8_0", "Q4_K_M": "Q6_K" if embed else "Q4_K"}[variant]
    return target if shape[-1] % block(target) == 0 else "F16"


# ------------------------------------------------------------------------------------- writing

_FILE_TYPE = {"F32": 0, "Q8_0": 7, "Q4_K_M": 15}  # llama.cpp LlamaFileType ids (informational)


def write_gguf(path: Path, arch: str, kv: list, tensors: list, variant: str, ggml: Ggml | None) -> dict:
    """Stream ``tensors`` into ``path`` (temp name + rename), one quantized at a time; returns type counts."""
    import gguf

    block = ggml.block if ggml is not None else (lambda t: 1)
    plan = [(name, arr, pick_type(name, arr.shape, variant, block)) for name, arr in tensors]
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    for key, value, kind in kv + [("general.file_type", _FILE_TYPE[variant], "u32"),
                                  ("general.quantization_version", 2, "u32")]:  # fmt: skip
        {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string, "bool": w.add_bool,
         "arr": w.add_array}[kind](key, value)  # fmt: skip
    for name, arr, qtype in plan:
        if qtype in ("F32", "F16"):
            dtype = np.float32 if qtype == "F32" else np.float16
            w.add_tensor_info(name, arr.shape, np.dtype(dtype), arr.size * np.dtype(dtype).itemsize)
        else:
            row = int(ggml.lib.ggml_row_size(GGML[qtype], arr.shape[-1]))
            w.add_tensor_info(name, (*arr.shape[:-1], row), np.dtype(np.uint8), arr.size // arr.shape[-1] * row,
                              raw_dtype=gguf.GGMLQuantizationType[qtype])  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    counts: dict = {}
    for _name, arr, qtype in plan:
        counts[qtype] = counts.get(qtype, 0) + 1
        if qtype in ("F32", "F16"):
            w.write_tensor_data(np.ascontiguousarray(arr, dtype=np.float32 if qtype == "F32" else np.float16))
        else:
            w.write_tensor_data(ggml.quantize(arr, qtype))
    w.close()
    os.replace(tmp, path)
    return counts


def convert(
    ckpt: Path, out_dir: Path, variant: str, tok_dir: Path | None = None, force: bool = False
) -> tuple:
    """Write ``talker-<variant>.gguf`` and ``codec-<variant>.gguf`` for ``ckpt`` under ``out_dir``."""
    if variant not in TYPES:
        raise ValueError(f"unknown type {variant!r}; choose from {', '.join(TYPES)}")
    need = [
        "config.json",
        "model.safetensors",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
    ]
    missing = [f for f in need if not (ckpt / f).is_file()]
    if missing:
        raise ValueError(f"{ckpt} is not a Qwen3-TTS snapshot: {', '.join(missing)} missing")
    out_dir.mkdir(parents=True, exist_ok=True)
    ggml = Ggml() if variant != "F32" else None
    talker, codec = out_dir / f"talker-{variant}.gguf", out_dir / f"codec-{variant}.gguf"
    cfg = json.loads((ckpt / "config.json").read_text())
    gen_path = ckpt / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    if force or not talker.exists():
        tensors = mapped_tensors(read_safetensors(ckpt / "model.safetensors"), _TALKER)
        counts = write_gguf(talker, "qwen3-tts", talker_kv(cfg, gen, tok_dir or ckpt), tensors, variant, ggml)
        log.info("wrote %s: %d tensors %s", talker, len(tensors), counts)
    if force or not codec.exists():
        st = ckpt / "speech_tokenizer"
        ccfg = json.loads((st / "config.json").read_text())
        acoustic = ccfg["encoder_valid_num_quantizers"] - ccfg["encoder_config"]["num_semantic_quantizers"]
        keep = lambda side, layer: side != "acoustic" or layer < acoustic  # noqa: E731  (16 codebooks are used)
        tensors = mapped_tensors(read_safetensors(st / "model.safetensors"), _CODEC, keep)
        dim = next(a.shape[1] for n, a in tensors if n.startswith("tok_dec.vq_first.0.codebook"))
        counts = write_gguf(codec, "qwen3-tts-tokenizer", codec_kv(ccfg, dim), tensors, variant, ggml)
        log.info("wrote %s: %d tensors %s", codec, len(tensors), counts)
    return talker, codec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "checkpoint", type=Path, help="Qwen3-TTS snapshot (config.json, model.safetensors, speech_tokenizer/)"
    )
    ap.add_argument("out_dir", type=Path, help="where talker-<TYPE>.gguf and codec-<TYPE>.gguf go")
    ap.add_argument(
        "--type", nargs="+", default=["F32"], choices=TYPES, help="GGUF variants to write (default F32)"
    )
    ap.add_argument("--tokenizer", type=Path, help="directory with vocab.json, merges.txt, tokenizer_config.json "
                    "(default: the checkpoint)")  # fmt: skip
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        for variant in args.type:
            convert(args.checkpoint, args.out_dir, variant, args.tokenizer, args.force)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"peer_gguf: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
