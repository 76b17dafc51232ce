"""Audio containers and writers.

:class:`AudioChunk` is the unit that :meth:`qtts.TTS.stream` yields; :class:`Audio` is a whole
utterance. Files are written through :class:`AudioWriter` in the format of the extension (WAV
streams 16-bit PCM to disk and patches the header sizes at the end; flac/mp3/opus go through
libsndfile); files are written to a temporary name and renamed, so a failed run never leaves a
half-written file at the target path.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..config import SAMPLE_RATE
from ..errors import InputError
from ..files import temp_beside

#: file formats by extension: 16-bit WAV, raw 16-bit PCM, and libsndfile's encoders
AUDIO_FORMATS = ("wav", "flac", "mp3", "opus", "pcm")
_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}


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


class AudioWriter:
    """Write mono audio progressively: 16-bit WAV or raw PCM, or flac/mp3/opus through libsndfile.

    ``fmt`` defaults to the file extension (:func:`format_from_path`). The audio goes to a
    temporary file beside ``path`` (created with the umask's permissions) that is renamed on
    :meth:`close`. Use as a context manager: if the block raises, the temporary file is removed
    and the target path is left untouched.
    """

    def __init__(self, path: str, sample_rate: int = SAMPLE_RATE, fmt: str | None = None):
        self.path, self.sample_rate = path, sample_rate
        self.fmt = fmt or format_from_path(path)
        if self.fmt not in AUDIO_FORMATS:
            raise InputError(f"unknown audio format '{self.fmt}'; use one of {', '.join(AUDIO_FORMATS)}")
        self._tmp = temp_beside(path, f".{self.fmt}.part")
        self._data_bytes = 0
        self._sf = self._fh = None
        try:
            if self.fmt in _SOUNDFILE:
                import soundfile

                container, subtype = _SOUNDFILE[self.fmt]
                self._sf = soundfile.SoundFile(self._tmp, "w", samplerate=sample_rate, channels=1,
                                               format=container, subtype=subtype)
            else:
                self._fh = open(self._tmp, "wb")
                self._fh.write(_wav_header(sample_rate, 0) if self.fmt == "wav" else b"")
        except BaseException:
            os.unlink(self._tmp)
            raise

    def write(self, samples: np.ndarray) -> None:
        if self._sf is not None:
            try:
                self._sf.write(np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0))
            except RuntimeError as exc:  # soundfile.LibsndfileError: "System error." on a full disk
                raise self._io_error(exc) from None
            return
        data = float_to_int16(samples).tobytes()
        self._fh.write(data)
        self._fh.flush()
        self._data_bytes += len(data)

    def _io_error(self, exc: Exception) -> OSError:
        """libsndfile says only "System error." when a write fails: ENOSPC when the disk has
        (almost) no room left, else EIO with libsndfile's words."""
        import errno

        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(self._tmp)))
            full = st.f_bavail * st.f_frsize < 1 << 20
        except OSError:
            full = False
        if full:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        return OSError(errno.EIO, f"cannot write the audio ({exc})", self.path)

    def close(self) -> None:
        if self._sf is not None:
            try:
                self._sf.close()
            except RuntimeError as exc:
                raise self._io_error(exc) from None
        else:
            if self.fmt == "wav":
                self._fh.seek(0)
                self._fh.write(_wav_header(self.sample_rate, self._data_bytes))
            self._fh.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            (self._sf if self._sf is not None else self._fh).close()
        except (OSError, RuntimeError):  # the write that failed fails again as it flushes: the file goes anyway
            pass
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __enter__(self) -> AudioWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class WavWriter(AudioWriter):
    """16-bit mono WAV whatever the file name says."""

    def __init__(self, path: str, sample_rate: int = SAMPLE_RATE):
        super().__init__(path, sample_rate, "wav")


def format_from_path(path: str) -> str:
    """'out.mp3' -> 'mp3'; an InputError naming the valid extensions for anything else."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in AUDIO_FORMATS:
        valid = ", ".join("." + f for f in AUDIO_FORMATS)
        raise InputError(f"{path}: cannot tell the audio format from the file name; end it in one of {valid}")
    return ext


def write_audio(path: str, samples: np.ndarray, sample_rate: int = SAMPLE_RATE, fmt: str | None = None) -> None:
    """Write a whole mono float signal atomically, in ``fmt`` or the format of the extension."""
    with AudioWriter(path, sample_rate, fmt) as w:
        w.write(samples)


def write_wav(path: str, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a whole mono float signal as 16-bit WAV, atomically."""
    write_audio(path, samples, sample_rate, "wav")


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
