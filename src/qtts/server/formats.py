"""Response formats: float32 audio chunks -> the bytes of a wav/pcm/flac/mp3/opus response.

A format writer is fed from a worker thread: ``start()`` once, ``write(samples)`` per chunk,
``finish()`` once; each returns the bytes ready to send. ("Encoder" in qtts means only the
speaker and speech encoders of voice cloning.) What streams:

* ``wav``: a streaming header (sizes set to the maximum, as live WAV streams do), then 16-bit PCM
  per chunk;
* ``pcm``: raw signed 16-bit little-endian mono at 24 kHz, per chunk (OpenAI's ``pcm``);
* ``opus``: Ogg/Opus pages as libsndfile emits them (bytes leave as pages fill, ~0.5 s);
* ``mp3`` (the default, as OpenAI's): constant-bitrate MPEG-2 Layer III frames (80 kbit/s) as
  LAME emits them, per chunk. libsndfile patches the first frame (LAME's Xing/Info tag) when the
  file closes; a stream cannot take bytes back, so the first frame stays the silent placeholder
  LAME wrote (24 ms of silence) and decoders take the length from the constant bitrate;
* ``flac``: written once at the end, because its STREAMINFO sample count is patched when the file
  is closed and many decoders trust it; the response is still chunked but its bytes arrive when
  generation ends.

All of them use ``soundfile`` (libsndfile wheel), a core dependency: no system tools.
"""

from __future__ import annotations

import io

import numpy as np

from ..audio.chunk import SAMPLE_RATE, float_to_int16, wav_header_streaming

MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
}


class FormatWriter:
    """Base: raw 16-bit PCM."""

    media_type = MEDIA_TYPES["pcm"]

    def __init__(self, sample_rate: int = SAMPLE_RATE):
        self.sample_rate = sample_rate

    def start(self) -> bytes:
        return b""

    def write(self, samples: np.ndarray) -> bytes:
        return float_to_int16(samples).tobytes()

    def finish(self) -> bytes:
        return b""


class WavWriter(FormatWriter):
    media_type = MEDIA_TYPES["wav"]

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


class SoundfileWriter(FormatWriter):
    """flac / mp3 / opus through libsndfile; ``streams`` says whether bytes leave per chunk (then
    bytes libsndfile rewrites at close, before what was sent, are not sent again)."""

    _FORMATS = {"flac": ("FLAC", "PCM_16", False), "mp3": ("MP3", "MPEG_LAYER_III", True),
                "opus": ("OGG", "OPUS", True)}
    #: mp3: constant bitrate (a stream has no Xing frame count, so decoders size it by the bitrate);
    #: compression level 0.5 = 80 kbit/s at 24 kHz mono
    _EXTRA = {"mp3": {"bitrate_mode": "CONSTANT", "compression_level": 0.5}}

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE):
        super().__init__(sample_rate)
        import soundfile

        self.media_type = MEDIA_TYPES[fmt]
        container, subtype, self.streams = self._FORMATS[fmt]
        self._file = _AppendOnlyFile()
        self._sf = soundfile.SoundFile(
            self._file, "w", samplerate=sample_rate, channels=1, format=container, subtype=subtype,
            **self._EXTRA.get(fmt, {}),
        )

    def write(self, samples: np.ndarray) -> bytes:
        self._sf.write(np.asarray(samples, dtype=np.float32))
        return self._file.take_new() if self.streams else b""

    def finish(self) -> bytes:
        self._sf.close()
        if self.streams:
            return self._file.take_new()
        return bytes(self._file.buf)


def open_format(fmt: str, sample_rate: int = SAMPLE_RATE) -> FormatWriter:
    """The writer of response format ``fmt`` (one of MEDIA_TYPES)."""
    if fmt == "wav":
        return WavWriter(sample_rate)
    if fmt == "pcm":
        return FormatWriter(sample_rate)
    return SoundfileWriter(fmt, sample_rate)
