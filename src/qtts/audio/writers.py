"""Audio writers, one family: mono float32 chunks -> the bytes of wav, pcm, flac, mp3 or opus.

A *stream* (:func:`open_stream`) turns chunks into bytes ready to send: ``start()`` once,
``write(samples)`` per chunk, ``finish()`` once, each returning bytes. The server sends them as they
come; :class:`AudioWriter` writes them to a file (``qtts say -o``, ``Audio.save``). ("Encoder" in
qtts means only the speaker and speech encoders of voice cloning.) What streams:

* ``wav``: a streaming header (sizes set to the maximum, as live WAV streams do), then 16-bit PCM
  per chunk; a file gets the real sizes written into its header when it is closed;
* ``pcm``: raw signed 16-bit little-endian mono (OpenAI's ``pcm``), per chunk;
* ``opus``: Ogg/Opus pages as libsndfile emits them (bytes leave as pages fill, ~0.5 s);
* ``mp3``: MPEG Layer III frames as LAME emits them, per chunk. libsndfile patches the first frame
  (LAME's Xing/Info tag) when the file closes; a stream cannot take bytes back, so a streamed mp3
  keeps the silent placeholder frame (24 ms) and is constant-bitrate (80 kbit/s) so decoders size
  it by the bitrate; a file gets its tag (and libsndfile's default bitrate);
* ``flac``: written once at the end when streamed, because its STREAMINFO sample count is patched
  when the file is closed and many decoders trust it.

flac, mp3 and opus use ``soundfile`` (libsndfile wheel), a core dependency: no system tools. Files
are written to a temporary name beside the target and renamed when complete, so a failed run never
leaves a half-written file at the target path.
"""

from __future__ import annotations

import errno
import io
import os
import struct

import numpy as np

from ..config import SAMPLE_RATE
from ..errors import InputError
from ..files import temp_beside

#: file formats by extension: 16-bit WAV, raw 16-bit PCM, and libsndfile's encoders
AUDIO_FORMATS = ("wav", "flac", "mp3", "opus", "pcm")
#: libsndfile (container, subtype) of the formats it writes
SOUNDFILE_FORMATS = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> int16 (clipped, rounded)."""
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(x * 32767.0).astype("<i2")


def wav_header(sample_rate: int, data_bytes: int, channels: int = 1) -> bytes:
    """The 44-byte header of a 16-bit PCM WAV with ``data_bytes`` of samples."""
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
    hdr = bytearray(wav_header(sample_rate, 0))
    hdr[4:8] = struct.pack("<I", 0xFFFFFFFF)
    hdr[40:44] = struct.pack("<I", 0xFFFFFFFF - 36)
    return bytes(hdr)


class PcmStream:
    """Raw 16-bit PCM; the base of the streams."""

    def __init__(self, sample_rate: int = SAMPLE_RATE):
        self.sample_rate = sample_rate

    def start(self) -> bytes:
        return b""

    def write(self, samples: np.ndarray) -> bytes:
        return float_to_int16(samples).tobytes()

    def finish(self) -> bytes:
        return b""

    def abort(self) -> None:
        """Drop what is unfinished (nothing to drop here)."""


class WavStream(PcmStream):
    """A streaming WAV header, then 16-bit PCM."""

    def start(self) -> bytes:
        return wav_header_streaming(self.sample_rate)


class _AppendOnlyFile(io.RawIOBase):
    """A seekable in-memory file that remembers how much of it was already handed out."""

    def __init__(self):
        self.buf = bytearray()
        self.pos = 0
        self.sent = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self.buf[self.pos : self.pos + len(data)] = data
        self.pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: len(self.buf)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        return 0

    def take_new(self) -> bytes:
        out = bytes(self.buf[self.sent :])
        self.sent = len(self.buf)
        return out


class SoundfileStream(PcmStream):
    """flac / mp3 / opus through libsndfile. In memory (``path`` None), mp3 and opus return bytes
    per chunk (bytes libsndfile rewrites at close, before what was sent, are not sent again) and
    flac all of them at ``finish``; with ``path``, libsndfile writes that file and returns nothing."""

    #: formats whose bytes leave per chunk when streamed
    _STREAMED = ("mp3", "opus")
    #: streamed mp3: constant bitrate (a stream has no Xing frame count, so decoders size it by the
    #: bitrate); compression level 0.5 = 80 kbit/s at 24 kHz mono
    _EXTRA = {"mp3": {"bitrate_mode": "CONSTANT", "compression_level": 0.5}}

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE, path: str | None = None):
        super().__init__(sample_rate)
        import soundfile

        container, subtype = SOUNDFILE_FORMATS[fmt]
        self._file = _AppendOnlyFile() if path is None else None
        self.streams = path is None and fmt in self._STREAMED
        extra = self._EXTRA.get(fmt, {}) if path is None else {}
        self._sf = soundfile.SoundFile(path if path is not None else self._file, "w", samplerate=sample_rate,
                                       channels=1, format=container, subtype=subtype, **extra)  # fmt: skip

    def write(self, samples: np.ndarray) -> bytes:
        self._sf.write(np.asarray(samples, dtype=np.float32))
        return self._file.take_new() if self.streams else b""

    def finish(self) -> bytes:
        self._sf.close()
        if self._file is None:
            return b""
        return self._file.take_new() if self.streams else bytes(self._file.buf)

    def abort(self) -> None:
        try:
            self._sf.close()
        except (OSError, RuntimeError):  # the write that failed fails again as it flushes
            pass


def open_stream(fmt: str, sample_rate: int = SAMPLE_RATE) -> PcmStream:
    """The stream of format ``fmt`` (one of AUDIO_FORMATS), in memory."""
    if fmt == "wav":
        return WavStream(sample_rate)
    if fmt == "pcm":
        return PcmStream(sample_rate)
    if fmt in SOUNDFILE_FORMATS:
        return SoundfileStream(fmt, sample_rate)
    raise InputError(f"unknown audio format '{fmt}'; use one of {', '.join(AUDIO_FORMATS)}")


class AudioWriter:
    """Write mono audio progressively to a file: the stream of its format (samples clipped to
    [-1, 1]), to a temporary file beside ``path`` (created with the umask's permissions) renamed
    on :meth:`close`; a WAV gets its sizes in the header then.

    ``fmt`` defaults to the file extension (:func:`format_from_path`). Use as a context manager:
    if the block raises, the temporary file is removed and the target path is left untouched.
    """

    def __init__(self, path: str, sample_rate: int = SAMPLE_RATE, fmt: str | None = None):
        self.path, self.sample_rate = path, sample_rate
        self.fmt = fmt or format_from_path(path)
        if self.fmt not in AUDIO_FORMATS:
            raise InputError(f"unknown audio format '{self.fmt}'; use one of {', '.join(AUDIO_FORMATS)}")
        self._tmp = temp_beside(path, f".{self.fmt}.part")
        self._data_bytes = 0
        self._fh = None
        try:
            if self.fmt in SOUNDFILE_FORMATS:  # libsndfile seeks in the file to finish it
                self._stream = SoundfileStream(self.fmt, sample_rate, path=self._tmp)
            else:
                self._stream = open_stream(self.fmt, sample_rate)
                self._fh = open(self._tmp, "wb")
                self._fh.write(self._stream.start())
        except BaseException:
            os.unlink(self._tmp)
            raise

    def write(self, samples: np.ndarray) -> None:
        try:
            data = self._stream.write(np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0))
        except RuntimeError as exc:  # soundfile.LibsndfileError: "System error." on a full disk
            raise self._io_error(exc) from None
        if self._fh is not None:
            self._fh.write(data)
            self._fh.flush()
            self._data_bytes += len(data)

    def _io_error(self, exc: Exception) -> OSError:
        """libsndfile says only "System error." when a write fails: ENOSPC when the disk has
        (almost) no room left, else EIO with libsndfile's words."""
        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(self._tmp)))
            full = st.f_bavail * st.f_frsize < 1 << 20
        except OSError:
            full = False
        if full:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        return OSError(errno.EIO, f"cannot write the audio ({exc})", self.path)

    def close(self) -> None:
        try:
            tail = self._stream.finish()
        except RuntimeError as exc:
            raise self._io_error(exc) from None
        if self._fh is not None:
            self._fh.write(tail)
            if self.fmt == "wav":
                self._fh.seek(0)
                self._fh.write(wav_header(self.sample_rate, self._data_bytes))
            self._fh.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._stream.abort()
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:  # the write that failed fails again as it flushes: the file goes anyway
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
    """A 16-bit mono WAV file whatever the file name says."""

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
