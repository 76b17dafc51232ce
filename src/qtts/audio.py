"""Audio containers and writers.

:class:`AudioChunk` is the unit that :meth:`qtts.TTS.stream` yields; :class:`Audio` is a whole
utterance. WAV output is written through :class:`WavWriter`, which streams PCM to disk and
patches the header sizes at the end; files are written to a temporary name and renamed, so a
failed run never leaves a half-written file at the target path.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass, field

import numpy as np

from .config import SAMPLE_RATE


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> int16 (clipped, rounded)."""
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(x * 32767.0).astype("<i2")


@dataclass
class AudioChunk:
    """A piece of generated audio: mono float32 samples in [-1, 1]."""

    samples: np.ndarray
    sample_rate: int = SAMPLE_RATE
    #: index of the first codec frame this chunk covers (frames are 1920 samples at 24 kHz)
    frame_start: int = 0
    #: number of codec frames in this chunk
    num_frames: int = 0
    #: True on the last chunk of an utterance
    is_final: bool = False
    #: on the final chunk: 'eos', 'length' or 'runaway' (see qtts.generate)
    finish_reason: str | None = None
    #: free-form stats (timings, frame counts); filled by the engine
    info: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return len(self.samples) / float(self.sample_rate)

    @property
    def int16_bytes(self) -> bytes:
        """Little-endian 16-bit PCM bytes (computed on demand)."""
        return float_to_int16(self.samples).tobytes()


@dataclass
class Audio:
    """A whole utterance."""

    samples: np.ndarray
    sample_rate: int = SAMPLE_RATE
    finish_reason: str | None = None
    info: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return len(self.samples) / float(self.sample_rate)

    def save(self, path: str) -> None:
        write_wav(path, self.samples, self.sample_rate)


def _wav_header(sample_rate: int, data_bytes: int, channels: int = 1) -> bytes:
    byte_rate = sample_rate * channels * 2
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, byte_rate, channels * 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def wav_header_streaming(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum)."""
    hdr = bytearray(_wav_header(sample_rate, 0))
    hdr[4:8] = struct.pack("<I", 0xFFFFFFFF)
    hdr[40:44] = struct.pack("<I", 0xFFFFFFFF - 36)
    return bytes(hdr)


class WavWriter:
    """Write 16-bit mono WAV progressively; valid header written on close; atomic rename.

    Use as a context manager. If the block raises, the temporary file is removed and the
    target path is left untouched.
    """

    def __init__(self, path: str, sample_rate: int = SAMPLE_RATE):
        self.path = path
        self.sample_rate = sample_rate
        directory = os.path.dirname(os.path.abspath(path))
        fd, self._tmp = tempfile.mkstemp(prefix=".qtts-", suffix=".wav.part", dir=directory)
        self._fh = os.fdopen(fd, "wb")
        self._fh.write(_wav_header(sample_rate, 0))
        self._data_bytes = 0

    def write(self, samples: np.ndarray) -> None:
        data = float_to_int16(samples).tobytes()
        self._fh.write(data)
        self._fh.flush()
        self._data_bytes += len(data)

    def close(self) -> None:
        self._fh.seek(0)
        self._fh.write(_wav_header(self.sample_rate, self._data_bytes))
        self._fh.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._fh.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __enter__(self) -> WavWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_wav(path: str, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a whole mono float signal as 16-bit WAV, atomically."""
    with WavWriter(path, sample_rate) as w:
        w.write(samples)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """10·log10(Σref² / Σ(ref−test)²) over the common length; inf when identical."""
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    tst = np.asarray(test, dtype=np.float64).reshape(-1)
    n = min(len(ref), len(tst))
    if n == 0:
        raise ValueError("snr_db: empty signal")
    err = float(np.sum((ref[:n] - tst[:n]) ** 2))
    sig = float(np.sum(ref[:n] ** 2))
    if err == 0.0:
        return float("inf")
    return 10.0 * np.log10(max(sig, 1e-30) / err)
