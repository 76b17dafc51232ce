"""Numpy audio front end of the speaker encoder: log-mel spectrogram and resampling.

:func:`log_mel` equals the official ``mel_spectrogram(y, n_fft=1024, num_mels=128, sampling_rate=24000,
hop_size=256, win_size=1024, fmin=0, fmax=12000)``: reflect pre-padding of (n_fft - hop) / 2 = 384
samples, STFT without centering and a periodic Hann window, magnitude ``sqrt(re^2 + im^2 + 1e-9)``,
a Slaney-scale / Slaney-normalized mel filterbank (librosa's default, computed here), then
``log(max(mel, 1e-5))``. Frames = (N + 768 - 1024) // 256 + 1.

:func:`resample` is a Kaiser-windowed sinc polyphase resampler (numpy only). The official wrapper uses
``librosa.resample`` (soxr 'HQ'); see docs/encoders.md for the measured difference.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .config import SAMPLE_RATE
from .errors import InputError

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


def _kaiser_sinc_table(up: int, down: int, zeros: int, rolloff: float, beta: float):
    """Polyphase table ``[up, taps]``: phase p holds the filter at input offsets for output phase p."""
    cutoff = rolloff * min(1.0, up / down)  # in units of the input Nyquist
    half = int(math.ceil(zeros / cutoff))  # half-width in input samples
    offsets = np.arange(-half + 1, half + 1, dtype=np.float64)  # input index - floor(position)
    frac = np.arange(up, dtype=np.float64) / up  # fractional part of the position per phase
    t = offsets[None, :] - frac[:, None]  # [up, taps], distance in input samples
    window = np.i0(beta * np.sqrt(np.clip(1.0 - (t / half) ** 2, 0.0, 1.0))) / np.i0(beta)
    table = cutoff * np.sinc(cutoff * t) * window
    return table, half


def resample(
    wav: np.ndarray, sr_in: int, sr_out: int, *, zeros: int = 64, rolloff: float = 0.957, beta: float = 9.0
) -> np.ndarray:
    """Band-limited resampling of a mono float waveform; output length as librosa: ``ceil(N * (sr_out / sr_in))``.

    Kaiser-windowed sinc (``zeros`` zero crossings each side, passband edge ``rolloff`` of the lower
    Nyquist), evaluated exactly at each output instant ``n * sr_in / sr_out`` via a polyphase table;
    zero signal outside the input. Returns float32.
    """
    x = np.asarray(wav, dtype=np.float32).reshape(-1)
    sr_in, sr_out = int(sr_in), int(sr_out)
    if sr_in <= 0 or sr_out <= 0:
        raise InputError(f"sample rates must be positive integers, got {sr_in} -> {sr_out}")
    if sr_in == sr_out:
        return x.copy()
    g = math.gcd(sr_in, sr_out)
    up, down = sr_out // g, sr_in // g
    # librosa's length rule (float ratio, so 44100 Hz x 1 s -> 24001 samples), for drop-in equality
    n_out = int(math.ceil(x.shape[0] * (sr_out / sr_in)))
    table, half = _kaiser_sinc_table(up, down, zeros, rolloff, beta)
    taps = table.shape[1]
    padded = np.concatenate(
        [np.zeros(half, np.float64), x.astype(np.float64), np.zeros(half + 1, np.float64)]
    )
    out = np.empty(n_out, dtype=np.float64)
    chunk = max(1, (1 << 20) // taps)
    for start in range(0, n_out, chunk):
        stop = min(n_out, start + chunk)
        base, phase = np.divmod(np.arange(start, stop, dtype=np.int64) * down, up)  # pos = base + phase/up
        idx = base[:, None] + np.arange(taps)[None, :] + 1  # padded index of offsets -half+1 .. half
        out[start:stop] = np.einsum("ij,ij->i", padded[idx], table[phase])
    return out.astype(np.float32)
