"""Response formats as HTTP names them: the media type of each ``response_format`` and its writer.

The writers are :mod:`qtts.audio.writers`' streams (the same bytes ``qtts say -o`` writes to a
file; what streams per chunk and what arrives at the end is described there).
"""

from __future__ import annotations

from ..audio.writers import PcmStream, open_stream
from ..config import SAMPLE_RATE

MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
}


def open_format(fmt: str, sample_rate: int = SAMPLE_RATE) -> PcmStream:
    """The writer of response format ``fmt`` (one of MEDIA_TYPES): ``start()``, ``write(samples)``
    per chunk, ``finish()``, each returning the bytes to send."""
    return open_stream(fmt, sample_rate)
