"""Audio containers: :class:`AudioChunk`, the unit that :meth:`qtts.TTS.stream` yields, and
:class:`Audio`, a whole utterance; :func:`snr_db`. Files are written by :mod:`qtts.audio.writers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import SAMPLE_RATE
from .writers import float_to_int16, write_audio

__all__ = ["Audio", "AudioChunk", "snr_db"]


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
    #: on the final chunk: 'eos', 'length' or 'runaway' (see qtts.engine.generate)
    finish_reason: str | None = None
    #: free-form stats (timings, frame counts); filled by the engine
    info: dict = field(default_factory=dict)
    #: the codec frames this chunk's audio was decoded from, ``[num_frames, 16]`` int64 (None when
    #: the producer does not say); concatenated over a stream they are all generated frames in order
    codes: np.ndarray | None = None
    #: word timings finished since the previous chunk (``TTS.stream(..., timestamps=True)``):
    #: :class:`qtts.align.timing.WordTiming`, seconds from the start of the stream; empty otherwise
    words: list = field(default_factory=list)

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
    #: the codec frames it was decoded from, ``[frames, 16]`` int64 (:meth:`qtts.TTS.decode` takes them back)
    codes: np.ndarray | None = None
    #: every word timing of the stream (``timestamps=True``), in order; empty otherwise
    words: list = field(default_factory=list)

    @property
    def duration(self) -> float:
        return len(self.samples) / float(self.sample_rate)

    def save(self, path: str) -> None:
        """Write atomically in the format of the extension (.wav, .flac, .mp3, .opus, .pcm)."""
        write_audio(path, self.samples, self.sample_rate)


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
