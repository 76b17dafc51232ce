"""Numpy audio front end of the speaker encoder: log-mel spectrogram and resampling.

:func:`log_mel` equals the official ``mel_spectrogram(y, n_fft=1024, num_mels=128, sampling_rate=24000,
hop_size=256, win_size=1024, fmin=0, fmax=12000)``: reflect pre-padding of (n_fft - hop) / 2 = 384
samples, STFT without centering and a periodic Hann window, magnitude ``sqrt(re^2 + im^2 + 1e-9)``,
a Slaney-scale / Slaney-normalized mel filterbank (librosa's default, computed here), then
``log(max(mel, 1e-5))``. Frames = (N + 768 - 1024) // 256 + 1.

:func:`resample` is ``librosa.resample``'s default path (soxr 'HQ', then librosa's length rule) without
librosa: the samples equal the official wrapper's bit for bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..config import SAMPLE_RATE
from ..errors import InputError

N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0
_MAG_EPS = 1e-9
_LOG_FLOOR = 1e-5

# Slaney mel scale: linear below 1 kHz (3 bins per 200 Hz), logarithmic above.
_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    lin = hz / _F_SP
    log = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(hz >= _MIN_LOG_HZ, log, lin)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    lin = mel * _F_SP
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(mel, _MIN_LOG_MEL) - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log, lin)


@functools.lru_cache(maxsize=8)
def mel_filters(
    sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, fmin: float = 0.0, fmax: float = F_MAX
) -> np.ndarray:
    """Triangular Slaney filters ``[n_mels, n_fft//2 + 1]`` float32 (== librosa.filters.mel defaults)."""
    fft_hz = np.linspace(0.0, sr / 2.0, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]  # Slaney area normalization
    out = weights.astype(np.float32)
    out.setflags(write=False)
    return out


def log_mel(wav_24k: np.ndarray) -> np.ndarray:
    """Log-mel ``[frames, 128]`` float32 of a mono 24 kHz waveform (not normalized, like the official)."""
    y = np.asarray(wav_24k, dtype=np.float32).reshape(-1)
    pad = (N_FFT - HOP) // 2
    if y.shape[0] <= pad:
        raise InputError(
            f"audio too short for the speaker encoder: {y.shape[0]} samples; give at least {pad + 1} (24 kHz)"
        )
    y = np.pad(y, (pad, pad), mode="reflect")
    n_frames = (y.shape[0] - N_FFT) // HOP + 1  # >= 1 since N > 384
    frames = np.lib.stride_tricks.sliding_window_view(y, N_FFT)[::HOP][:n_frames]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
    spec = np.fft.rfft(frames.astype(np.float64) * window, axis=-1)  # [frames, 513]
    mag = np.sqrt(spec.real**2 + spec.imag**2 + _MAG_EPS)
    mel = mag @ mel_filters().T.astype(np.float64)  # [frames, 128]
    return np.log(np.maximum(mel, _LOG_FLOOR)).astype(np.float32)


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample a mono waveform exactly as the official wrapper does; returns float32.

    qwen-tts 0.1.1 calls ``librosa.resample(y, orig_sr=sr, target_sr=24000)``, whose default is
    ``soxr.resample(y, sr, 24000, quality="soxr_hq")`` followed by ``fix_length`` to
    ``ceil(N * sr_out / sr_in)`` samples (zero padded or cut at the end). This is that call
    without librosa (soxr is a core dependency: ~0.5 MB, numpy only), so reference audio at any
    rate gives the official samples bit for bit, hence the same speaker vector and ICL codes.
    """
    import soxr

    x = np.ascontiguousarray(np.asarray(wav, dtype=np.float32).reshape(-1))
    sr_in, sr_out = int(sr_in), int(sr_out)
    if sr_in <= 0 or sr_out <= 0:
        raise InputError(f"sample rates must be positive integers, got {sr_in} -> {sr_out}")
    if sr_in == sr_out:
        return x.copy()
    y = np.asarray(soxr.resample(x, sr_in, sr_out, quality="soxr_hq"), dtype=np.float32)
    n_out = int(math.ceil(x.shape[0] * (float(sr_out) / sr_in)))  # librosa's length rule (float ratio)
    if y.shape[0] >= n_out:
        return np.ascontiguousarray(y[:n_out])
    return np.concatenate([y, np.zeros(n_out - y.shape[0], dtype=np.float32)])
