"""Audio in and out: chunks and whole utterances with their writers (:mod:`.chunk`), the streaming
time stretch (:mod:`.stretch`), the log-mel front end and resampler (:mod:`.mel`), codec frames as
files (:mod:`.codes`).

``qtts.audio`` keeps the names it had as a module: ``from qtts.audio import AudioChunk`` works.
"""

from .chunk import (
    AUDIO_FORMATS,
    Audio,
    AudioChunk,
    AudioWriter,
    WavWriter,
    float_to_int16,
    format_from_path,
    snr_db,
    wav_header_streaming,
    write_audio,
    write_wav,
)

__all__ = ["AUDIO_FORMATS", "Audio", "AudioChunk", "AudioWriter", "WavWriter", "float_to_int16", "format_from_path",
           "snr_db", "wav_header_streaming", "write_audio", "write_wav"]  # fmt: skip
