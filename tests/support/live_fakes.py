"""Helpers for the live-text tests: a fake backend that records every talker input and gives each
text id its own vector, a vocoder wrapper that records the codes it decodes, and text sources."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import threading
import time

import numpy as np

from conftest import REAL_TOKENIZER_DIR, reference_configs
from qtts.api import TTS
from qtts.backends import Components
from qtts.backends.base import Vocoder, VocoderStream
from qtts.config import ModelConfig
from qtts.text.tokenizer import TextTokenizer
from support.fakes import FakeBackend

H = 8


class TextBackend(FakeBackend):
    """FakeBackend whose text vectors never collide (one seeded vector per id) and that records
    (position, input vectors) of every talker call."""

    def text_embeds(self, ids):
        return np.stack([np.random.default_rng(int(i)).standard_normal(self.hidden_size).astype(np.float32)
                         for i in np.asarray(ids).reshape(-1)])

    def talker(self, embeds, pos, state):
        self.events.append(("input", int(pos), np.asarray(embeds, np.float32).copy()))
        return super().talker(embeds, pos, state)


class RecordingVocoder(Vocoder):
    """Wraps a vocoder; ``codes`` collects every frame decoded (reference priming included)."""

    def __init__(self, inner):
        self.inner, self.codes, self.streams = inner, [], 0

    def stream(self):
        self.streams += 1
        inner, codes = self.inner.stream(), self.codes

        class Stream(VocoderStream):
            samples_per_frame = 1920

            def reset(self):
                inner.reset()

            def decode(self, c):
                codes.extend(np.asarray(c, np.int64).reshape(-1, 16))
                return inner.decode(c)

        return Stream()

    def take(self) -> np.ndarray:
        out = np.array(self.codes, np.int64).reshape(-1, 16)
        self.codes.clear()
        return out


class ZeroVocoder(Vocoder):
    def stream(self):
        class Stream(VocoderStream):
            samples_per_frame = 1920

            def reset(self):
                pass

            def decode(self, c):
                return np.zeros(len(np.asarray(c)) * 1920, np.float32)

        return Stream()


_TOKENIZER: list = []


def tokenizer() -> TextTokenizer:
    if not _TOKENIZER:
        _TOKENIZER.append(TextTokenizer.from_dir(REAL_TOKENIZER_DIR, regex="fixed"))
    return _TOKENIZER[0]


def fake_tts(kind: str = "Qwen3-TTS-12Hz-0.6B-Base", **backend_kw) -> tuple[TTS, TextBackend, RecordingVocoder]:
    cfg = ModelConfig.from_dir(reference_configs(kind), speech_tokenizer=False)
    cfg.talker_config.hidden_size = H
    backend = TextBackend(hidden_size=H, **backend_kw)
    vocoder = RecordingVocoder(ZeroVocoder())
    return TTS(Components(cfg, tokenizer(), backend, vocoder)), backend, vocoder


def recording(tts: TTS) -> tuple[TTS, RecordingVocoder]:
    """The same engine with its vocoder wrapped in a :class:`RecordingVocoder`."""
    vocoder = RecordingVocoder(tts.components.vocoder)
    return TTS(dataclasses.replace(tts.components, vocoder=vocoder)), vocoder


def chunkings(text: str, seed: int = 0) -> dict[str, list[str]]:
    """Ways an LLM might deliver ``text``: whole, words, characters, random splits."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, 9)))
    edges = [0, *cuts, len(text)]
    return {
        "whole": [text],
        "words": [w for w in re.split(r"(?=\s)", text) if w],
        "chars": list(text),
        "random": [text[a:b] for a, b in zip(edges, edges[1:])],
    }


def paced(pieces, wait):
    """An LLM emitting the next piece each time ``wait()`` returns (the first at once)."""
    for i, piece in enumerate(pieces):
        if i:
            wait()
        yield piece


def slow(pieces, delay_s: float):
    """An LLM emitting a piece every ``delay_s`` seconds (the first at once)."""
    return paced(pieces, lambda: time.sleep(delay_s))


class StepGate:
    """A batch observer whose :meth:`wait` returns once the batch has stepped ``steps`` more times
    (a text source paced by the batch, not the clock: it runs dry whatever the machine's load)."""

    def __init__(self, steps: int, timeout_s: float = 60.0):
        self.steps, self.timeout_s, self.seen = steps, timeout_s, 0
        self.cond = threading.Condition()

    def __call__(self, _stats) -> None:
        with self.cond:
            self.seen += 1
            self.cond.notify_all()

    def wait(self) -> None:
        with self.cond:
            target = self.seen + self.steps
            if not self.cond.wait_for(lambda: self.seen >= target, self.timeout_s):
                raise TimeoutError(f"the batch did not step {self.steps} times in {self.timeout_s} s")


async def aslow(pieces, delay_s: float):
    for i, piece in enumerate(pieces):
        if i:
            await asyncio.sleep(delay_s)
        yield piece


def decode_steps(backend: TextBackend) -> list[tuple[int, np.ndarray]]:
    """(position, input vector) of every one-vector talker call (the decode steps)."""
    return [(pos, x[0]) for kind, pos, x in (e for e in backend.events if e[0] == "input") if len(x) == 1]
