"""Helpers for the server's word-timestamp tests: a tiny aligner, short text pieces, no official aligner."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from conftest import REAL_TOKENIZER_DIR
from qtts.align.runtime import ENV_ALIGNER

#: four pieces of at most 30 characters (12 frames each with ShortPieces)
TEXT = "Hello there, this is the first sentence. And here comes the second one, a bit longer."
PIECE_FRAMES = 12


def tiny_aligner(root) -> str:
    """A tiny random Qwen3-ForcedAligner checkpoint (real Qwen2 vocabulary), as tests/api/test_timestamps.py makes."""
    from qtts.tools.random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(str(root / "tiny-aligner"), kind="forced_aligner", tokenizer_dir=REAL_TOKENIZER_DIR,
                                   seed=3)  # fmt: skip


@contextlib.contextmanager
def no_official_aligner(tmp_path):
    """No $QTTS_ALIGNER and an empty Hugging Face cache: an engine without aligner= finds none."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ENV_ALIGNER, raising=False)
        mp.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        yield


class ShortPieces:
    """A served TTS whose requests are cut into text pieces of at most 30 characters, 12 frames each
    (the request fields cannot ask for that), so word events arrive between audio events; a live
    session's talker contexts get 12 frames unless the session names its max_frames."""

    def __init__(self, tts):
        self.tts = tts

    def __getattr__(self, name):
        return getattr(self.tts, name)

    @staticmethod
    def options(options):
        return dataclasses.replace(options, max_frames=PIECE_FRAMES, max_sentence_chars=30, watchdog=False)

    def stream(self, text, options=None, **kwargs):
        return self.tts.stream(text, options=self.options(options), **kwargs)

    def stream_text(self, pieces, options=None, **kwargs):
        options = dataclasses.replace(options, max_frames=options.max_frames or PIECE_FRAMES)
        return self.tts.stream_text(pieces, options=options, **kwargs)
