"""End-to-end parity helpers: the official *public* wrapper vs our public API, compared as audio.

Both sides run greedy (``do_sample=False`` on both stages). Ours: ``TTS.synthesize`` (prompt,
numpy loop, streaming decoder). Theirs: ``Qwen3TTSModel.generate_voice_clone`` /
``generate_custom_voice`` (HF ``generate``, then the official offline decode). Random checkpoints
have a vocoder whose audio follows the codes (one changed code in one frame costs 14-23 dB;
``test_random_checkpoint_audio.py``), so audio within ``MIN_SNR_DB`` means every code of every
frame is equal; a mismatch reports the first frame whose audio differs.
"""

from __future__ import annotations

import numpy as np
import torch

from qtts.audio.chunk import snr_db

SPF = 1920  # samples per codec frame
MIN_SNR_DB = 70.0  # fp32 streamed vs official offline decode: ~90-110 dB; one wrong code: < 25 dB


def greedy_kwargs(max_frames: int) -> dict:
    """Official wrapper kwargs for greedy decoding with room for ``max_frames`` frames.

    HF ``generate`` with ``max_new_tokens = N`` returns N - 1 frames (the last code 0 never gets
    its residual codes), so N = max_frames + 1 gives the same budget as ours.
    """
    return dict(do_sample=False, subtalker_dosample=False, max_new_tokens=max_frames + 1)


def official_clone(w, text: str, items, language: str, non_streaming: bool, max_frames: int) -> np.ndarray:
    """Official ``generate_voice_clone`` audio from prompt items (``VoiceClonePromptItem`` list)."""
    with torch.no_grad():
        wavs, sr = w.generate_voice_clone(text=text, language=language, voice_clone_prompt=items,
                                          non_streaming_mode=non_streaming, **greedy_kwargs(max_frames))
    assert sr == 24000
    return np.asarray(wavs[0], dtype=np.float32)


def official_custom(w, text: str, speaker: str, language: str, instruct: str | None, non_streaming: bool,
                    max_frames: int) -> np.ndarray:
    with torch.no_grad():
        wavs, sr = w.generate_custom_voice(text=text, speaker=speaker, language=language, instruct=instruct,
                                           non_streaming_mode=non_streaming, **greedy_kwargs(max_frames))
    assert sr == 24000
    return np.asarray(wavs[0], dtype=np.float32)


def prompt_item(voice):
    """A qtts :class:`~qtts.voice.Voice` as the official ``VoiceClonePromptItem``."""
    from support import official

    official.qwen_tts()
    from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

    icl = voice.icl
    return VoiceClonePromptItem(
        ref_code=torch.from_numpy(np.asarray(voice.ref_codes, dtype=np.int64)) if icl else None,
        ref_spk_embedding=torch.from_numpy(voice.speaker), x_vector_only_mode=not icl, icl_mode=icl,
        ref_text=voice.ref_text if icl else None,
    )


def assert_same_audio(ours: np.ndarray, theirs: np.ndarray, what: str, min_snr: float = MIN_SNR_DB) -> float:
    """Same frame count and the same audio (>= ``min_snr`` dB); returns the SNR.

    The official ICL cut is ``int(ref_len / total_len * n_samples)`` in float arithmetic, which can
    keep one reference sample too many; the comparison then aligns the ends.
    """
    extra = len(theirs) - len(ours)
    assert 0 <= extra <= 1, f"{what}: {len(ours) / SPF:.2f} frames (ours) vs {len(theirs) / SPF:.2f} (official)"
    theirs = theirs[extra:]
    snr = snr_db(theirs, ours)
    if snr < min_snr:
        frames = [snr_db(theirs[i : i + SPF], ours[i : i + SPF]) for i in range(0, len(ours), SPF)]
        first = next(i for i, s in enumerate(frames) if s < min_snr)
        raise AssertionError(f"{what}: audio SNR {snr:.1f} dB < {min_snr} dB; first differing frame {first} "
                             f"of {len(frames)} (per-frame SNR from there: {np.round(frames[first:first + 4], 1)})")
    return snr
