"""Audio in and out: chunks and whole utterances (:mod:`.chunk`), the one family of writers for
files and streamed responses (:mod:`.writers`), the streaming time stretch (:mod:`.stretch`), the
log-mel front end and resampler (:mod:`.mel`), codec frames as files (:mod:`.codes`).

``qtts.audio`` keeps the names it had as a module: ``from qtts.audio import AudioChunk`` works.
"""

from .chunk import Audio, AudioChunk, snr_db
from .writers import (
    AUDIO_FORMATS,
    AudioWriter,
    WavWriter,
    float_to_int16,
    format_from_path,
    open_stream,
    wav_header_streaming,
    write_audio,
    write_wav,
)

__all__ = ["AUDIO_FORMATS", "Audio", "AudioChunk", "AudioWriter", "WavWriter", "float_to_int16", "format_from_path",
           "open_stream", "snr_db", "wav_header_streaming", "write_audio", "write_wav"]  # fmt: skip
