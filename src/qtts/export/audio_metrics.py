"""Waveform distances for the vocoder's fidelity (docs/fidelity.md, "The bf16 bar").

* :func:`qtts.audio.snr_db`: ``10 log10(Σ ref² / Σ (ref − test)²)`` over the whole clip;
* :func:`worst_segment_snr_db`: the same per non-overlapping segment of :data:`SEGMENT_S` (170 ms,
  4080 samples at 24 kHz), the lowest one: a clip-wide SNR hides a short burst of error (a peer's
  int8 vocoder measured 37.7 dB over a clip and 26 dB in its worst 4k-sample segment);
* :func:`log_spectral_distance`: the RMS over frequency of the dB difference of the two power
  spectra, averaged over STFT frames: an error the ear hears as a changed timbre shows here even
  where it is small in amplitude.
"""

from __future__ import annotations

import numpy as np

from ..audio.chunk import snr_db

SEGMENT_S = 0.170
#: a segment whose reference energy is below this fraction of the clip's mean segment energy is
#: silence: its SNR measures the noise floor, not the decoder, and is skipped
SILENCE = 1e-4
#: STFT of the log-spectral distance: Hann window, 1024 samples (42.7 ms at 24 kHz), hop 256
N_FFT, HOP = 1024, 256
#: power floor of the log-spectral distance, relative to the reference's mean power per bin (-80 dB)
FLOOR = 1e-8


def _pair(reference, test) -> tuple[np.ndarray, np.ndarray]:
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    tst = np.asarray(test, dtype=np.float64).reshape(-1)
    if len(ref) != len(tst):
        raise ValueError(f"signals differ in length: {len(ref)} vs {len(tst)} samples")
    if len(ref) == 0:
        raise ValueError("empty signal")
    return ref, tst


def worst_segment_snr_db(reference, test, sample_rate: int = 24000, segment_s: float = SEGMENT_S) -> float:
    """The lowest SNR (dB) over the non-overlapping ``segment_s`` segments of the clip (a trailing
    partial segment is folded into the last full one; a clip shorter than one segment is one
    segment); silent segments (:data:`SILENCE`) are skipped. inf when every segment is exact."""
    ref, tst = _pair(reference, test)
    seg = max(1, int(round(segment_s * sample_rate)))
    count = max(1, len(ref) // seg)
    bounds = [i * seg for i in range(count)] + [len(ref)]
    energy = np.array([np.sum(ref[a:b] ** 2) for a, b in zip(bounds, bounds[1:])])
    loud = energy >= SILENCE * float(np.mean(energy))
    snrs = [snr_db(ref[a:b], tst[a:b]) for (a, b), keep in zip(zip(bounds, bounds[1:]), loud) if keep]
    return float(min(snrs)) if snrs else float("inf")


def _power_spectrogram(x: np.ndarray) -> np.ndarray:
    if len(x) < N_FFT:
        x = np.pad(x, (0, N_FFT - len(x)))
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]
    return np.abs(np.fft.rfft(frames * np.hanning(N_FFT), axis=-1)) ** 2


def log_spectral_distance(reference, test) -> float:
    """Mean over STFT frames of ``sqrt(mean_f (10 log10(P_ref / P_test))²)``, in dB (0: identical).

    ``P`` is the power spectrum (:data:`N_FFT`-sample Hann frames, hop :data:`HOP`) plus a floor of
    :data:`FLOOR` times the reference's mean power, so bins far below the signal do not dominate."""
    ref, tst = _pair(reference, test)
    p_ref, p_tst = _power_spectrogram(ref), _power_spectrogram(tst)
    floor = FLOOR * float(np.mean(p_ref)) + 1e-30
    diff = 10.0 * np.log10((p_ref + floor) / (p_tst + floor))
    return float(np.mean(np.sqrt(np.mean(diff**2, axis=-1))))


def audio_distances(reference, test, sample_rate: int = 24000) -> dict:
    """The three vocoder metrics of docs/fidelity.md: whole-clip SNR, worst 170 ms segment SNR, LSD."""
    return {
        "snr_db": snr_db(reference, test),
        "worst_segment_snr_db": worst_segment_snr_db(reference, test, sample_rate),
        "lsd_db": log_spectral_distance(reference, test),
    }
