"""Voices, in one place: the voice file (:mod:`~qtts.voice.file`, parsed once), reference audio for
cloning (:mod:`~qtts.voice.reference`) and a folder of voice files as the servers read it
(:mod:`~qtts.voice.folder`) and write it (:mod:`~qtts.voice.store`)."""

from .file import FORMAT, Voice
from .reference import (
    LONG_SECONDS,
    MAX_SECONDS,
    MIN_SECONDS,
    ReferenceInfo,
    ReferenceTooLong,
    add_trailing_silence,
    check_reference,
    check_reference_header,
    load_reference_audio,
    probe_reference,
)

__all__ = ["FORMAT", "LONG_SECONDS", "MAX_SECONDS", "MIN_SECONDS", "ReferenceInfo", "ReferenceTooLong", "Voice",
           "add_trailing_silence", "check_reference", "check_reference_header", "load_reference_audio",
           "probe_reference"]  # fmt: skip
