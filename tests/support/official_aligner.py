"""The official Qwen3-ForcedAligner (qwen-asr 0.0.6, installed ``--no-deps``) for the parity tests.

``import qwen_asr`` imports nagisa (Japanese splitter) at module level; when nagisa is missing an
empty stand-in module is installed first, so the non-Japanese paths still import. Helpers here
run the official pipeline piece by piece (its processor's inputs, its thinker's logits), so a
test can compare every stage, not only the final words.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.machinery
import sys
import types

import numpy as np
import torch

from qtts.errors import MissingDependencyError
from qtts.export.verify_aligner import speechlike  # noqa: F401  (the parity tests' clips)


def qwen_asr():
    """The imported official ``qwen_asr`` package."""
    try:
        import nagisa  # noqa: F401
    except ImportError:
        stub = types.ModuleType("nagisa")
        stub.__spec__ = importlib.machinery.ModuleSpec("nagisa", None)
        sys.modules.setdefault("nagisa", stub)
    env = ctypes.create_string_buffer(64)  # fenv_t (32 bytes on x86-64 glibc)
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fegetenv(env)
    try:
        import qwen_asr as pkg
    except ImportError as exc:
        raise MissingDependencyError(
            "the official aligner is needed for the aligner parity tests: pip install -e \".[reference]\" "
            "&& pip install qwen-asr==0.0.6 --no-deps"
        ) from exc
    finally:
        # its import loads a library built with -ffast-math, which turns on flush-to-zero for the whole
        # process: hypothesis then refuses every float strategy in the tests this worker runs later
        # (tests/server/test_hostile.py, test_schemathesis.py, ...); the floating-point state before it
        libm.fesetenv(env)
    return pkg


def official_aligner(path: str):
    """``Qwen3ForcedAligner.from_pretrained(path)`` in fp32 on the CPU (its default SDPA attention)."""
    return qwen_asr().Qwen3ForcedAligner.from_pretrained(path, dtype=torch.float32)


def official_stages(aligner, wav: np.ndarray, sample_rate: int, text: str, language: str) -> dict:
    """The official pipeline's words, input ids, features, logits, raw marker times and result."""
    from qwen_asr.inference.utils import normalize_audios

    words, prompt = aligner.aligner_processor.encode_timestamp(text, language)
    audio = normalize_audios([(wav, sample_rate)])
    inputs = aligner.processor(text=[prompt], audio=audio, return_tensors="pt", padding=True)
    with torch.inference_mode():
        logits = aligner.model.thinker(**inputs).logits
    ids = inputs["input_ids"]
    marker = ids[0] == aligner.timestamp_token_id
    times = (logits[0, marker].argmax(-1) * aligner.timestamp_segment_time).numpy()
    result = aligner.align(audio=(wav, sample_rate), text=text, language=language)[0]
    return {
        "words": words,
        "audio": audio[0],
        "input_ids": ids,
        "features": inputs["input_features"][0, :, : int(inputs["feature_attention_mask"].sum())],
        "logits": logits,
        "times": times,
        "result": [(it.text, it.start_time, it.end_time) for it in result],
    }


def parity_figures(snapshot: str, cases: dict) -> list[str]:
    """One line per case: sizes, feature and logit differences, the smallest top-2 margin, equal times."""
    from qtts.align import ForcedAligner
    from qtts.text.words import split_words

    official, ours = official_aligner(snapshot), ForcedAligner.from_dir(snapshot)
    lines = []
    for i, (case, (text, language, seconds)) in enumerate(cases.items()):
        wav = speechlike(i, seconds)
        ref = official_stages(official, wav, 24000, text, language)
        ids, mel = ours.inputs(wav, 24000, split_words(text, language))
        with torch.inference_mode():
            logits = ours.model(ids, mel)
        top = logits[0, ids[0] == ours.config.timestamp_token_id].topk(2, dim=-1).values
        lines.append(f"{case}: {len(ref['words'])} words, {ids.shape[1]} tokens, features max diff "
                     f"{(mel - ref['features']).abs().max():.1e}, logits max diff {(logits - ref['logits']).abs().max():.1e}"
                     f" (max |logit| {ref['logits'].abs().max():.2f}), smallest top-2 margin "
                     f"{(top[:, 0] - top[:, 1]).min():.1e}, times equal: "
                     f"{ours.marker_times(ids, logits).tolist() == ref['times'].tolist()}")  # fmt: skip
    return lines


if __name__ == "__main__":  # cd tests && ../.venv/bin/python -m support.official_aligner
    import tempfile

    from parity.test_aligner_parity import CASES, TOKENIZER
    from qtts.tools.random_checkpoint import write_random_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        snap = write_random_checkpoint(f"{tmp}/tiny", kind="forced_aligner", tokenizer_dir=TOKENIZER, seed=3)
        print("\n".join(parity_figures(snap, CASES)))
