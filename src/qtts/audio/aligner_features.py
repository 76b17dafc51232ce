"""The forced aligner's audio front end: mono 16 kHz waveform and its Whisper-style log-mel.

:func:`prepare_audio` does what the official wrapper's ``normalize_audio_input`` does to an
``(array, sample_rate)`` pair (qwen-asr 0.0.6): average channels, resample to 16 kHz with
librosa's default path (:func:`qtts.audio.mel.resample`, bit-equal to it), then divide by the
peak when it exceeds 1 and clip to [-1, 1].

:func:`log_mel` equals transformers' ``WhisperFeatureExtractor`` (4.57.3) torch path with the
aligner's settings (128 mels, n_fft 400, hop 160, no dither, no normalisation, one unpadded
input): centred reflect-padded STFT with a periodic Hann window, power spectrum without the last
frame, Slaney mel filterbank 0-8000 Hz (:func:`qtts.audio.mel.mel_filters`), ``log10(max(mel,
1e-10))``, floored at the maximum minus 8, then ``(x + 4) / 4``. Frames = samples // 160.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..model.aligner_config import ALIGNER_HOP, ALIGNER_N_FFT, ALIGNER_SAMPLE_RATE
from .mel import mel_filters, resample


def prepare_audio(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 16 kHz samples in [-1, 1] from ``wav`` ([T], or [T, C] / [C, T] with C <= 8)."""
    audio = np.asarray(wav)
    if audio.ndim == 2:
        if audio.shape[0] <= 8 and audio.shape[1] > audio.shape[0]:
            audio = audio.T
        audio = audio.mean(axis=-1)
    elif audio.ndim != 1:
        raise InputError(f"audio must be 1-D (mono) or 2-D (channels), got shape {audio.shape}")
    audio = audio.astype(np.float32)
    if int(sample_rate) != ALIGNER_SAMPLE_RATE:
        audio = resample(audio, int(sample_rate), ALIGNER_SAMPLE_RATE)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > 1.0:
        audio = audio / peak
    return np.clip(audio, -1.0, 1.0).astype(np.float32) if peak else audio


def log_mel(wav_16k: np.ndarray, n_mels: int = 128):
    """``torch.Tensor [n_mels, samples // 160]`` float32 log-mel of mono 16 kHz samples."""
    import torch

    samples = np.ascontiguousarray(np.asarray(wav_16k, dtype=np.float32).reshape(-1))
    if samples.shape[0] <= ALIGNER_N_FFT // 2:  # the centred STFT reflect-pads n_fft / 2 samples
        raise InputError(f"audio too short for the aligner: {samples.shape[0]} samples at 16 kHz; give at least "
                         f"{ALIGNER_N_FFT // 2 + 1}")  # fmt: skip
    x = torch.from_numpy(samples)[None]  # [1, T]: the extractor's batched path
    window = torch.hann_window(ALIGNER_N_FFT)
    stft = torch.stft(x, ALIGNER_N_FFT, ALIGNER_HOP, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2  # [1, 201, frames]
    fb = torch.from_numpy(np.array(mel_filters(ALIGNER_SAMPLE_RATE, ALIGNER_N_FFT, n_mels, 0.0, 8000.0)))
    spec = torch.clamp(fb @ power, min=1e-10).log10()
    spec = torch.maximum(spec, spec.amax(dim=(1, 2), keepdim=True) - 8.0)
    return ((spec + 4.0) / 4.0)[0]
