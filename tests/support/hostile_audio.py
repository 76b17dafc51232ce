"""Hostile reference-audio files for the reading-path and server tests: decompression bombs and
headers that lie (built with soundfile, a few KB each)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

STREAMINFO = 8  # 'fLaC' + the 4-byte metadata block header


def square_flac(seconds: float, sr: int = 24000) -> bytes:
    """A constant +-0.5 square wave as 16-bit FLAC: ~70 bytes per second of audio (a bomb)."""
    n = int(seconds * sr)
    sig = np.full(n, 0.5)
    sig[(np.arange(n) // 4096) % 2 == 1] = -0.5
    buf = io.BytesIO()
    sf.write(buf, sig, sr, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def flac_claiming(total_samples: int, seconds: float = 4.0) -> bytes:
    """A valid FLAC of ``seconds`` whose STREAMINFO says ``total_samples`` (36-bit field)."""
    x = bytearray(square_flac(seconds))
    assert x[:4] == b"fLaC"
    x[STREAMINFO + 13] = (x[STREAMINFO + 13] & 0xF0) | ((total_samples >> 32) & 0x0F)
    x[STREAMINFO + 14 : STREAMINFO + 18] = (total_samples & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(x)


def wav_8bit(seconds: float, sr: int = 8000) -> bytes:
    """8-bit 8 kHz WAV: the densest way to pack many seconds into few bytes without compression."""
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    sf.write(buf, 0.3 * rng.standard_normal(int(seconds * sr)), sr, format="WAV", subtype="PCM_U8")
    return buf.getvalue()
