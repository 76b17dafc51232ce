"""A fake engine with the qtts.TTS streaming contract, for server fault-injection tests.

It yields deterministic audio (a seeded tone per frame) in chunks like the real engine
(first_chunk_frames, then chunk_frames), counts the frames it generated, can sleep per frame
(to make cancellation observable), can block on a gate, and fails on demand ("boom" in the text fails before the
first chunk, "midfail" after it).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from qtts.audio.chunk import AudioChunk
from qtts.errors import InputError

FRAME = 1920


class FakeVoice:
    def __init__(self, seed: int, ref_text: str | None = None):
        self.seed, self.ref_text = seed, ref_text

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            fh.write(f"{self.seed}\n{self.ref_text or ''}")

    @classmethod
    def load(cls, path: str) -> FakeVoice:
        seed, text = open(path).read().split("\n", 1)
        return cls(int(seed), text or None)


class FakeTTS:
    thread_safe = False  # as qtts.TTS declares it: one generation at a time
    speakers = ["vivian", "ryan"]
    languages = ["auto", "english", "chinese"]

    def __init__(self, frames_per_char: int = 2, frame_delay: float = 0.0, gate: threading.Event | None = None):
        self.frames_per_char = frames_per_char
        self.frame_delay = frame_delay
        self.gate = gate  # when set: every frame waits for it (holds a worker busy on demand)
        self.frames_generated = 0
        self.calls = 0
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def _frame(self, rng: np.random.Generator) -> np.ndarray:
        f = rng.uniform(100, 400)
        t = np.arange(FRAME) / 24000.0
        return (0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32)

    def stream(self, text, voice=None, speaker=None, instruct=None, language=None, options=None):
        if language not in (None, *self.languages):
            raise InputError(f"unknown language {language!r}; choose one of {self.languages}")
        if "boom" in text:
            raise RuntimeError("engine exploded")
        seed = getattr(options, "seed", None) or 0
        seed += getattr(voice, "seed", 0) + (self.speakers.index(speaker) + 1 if speaker else 0)
        rng = np.random.default_rng(seed)
        total = len(text.strip()) * self.frames_per_char
        if getattr(options, "max_frames", None):
            total = min(total, options.max_frames)
        first = getattr(options, "first_chunk_frames", 2)
        size = getattr(options, "chunk_frames", 8)
        with self._lock:
            self.calls += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            done = 0
            while done < total:
                n = min(first if done == 0 else size, total - done)
                frames = []
                for _ in range(n):
                    if self.gate is not None:
                        self.gate.wait(30)
                    time.sleep(self.frame_delay)
                    frames.append(self._frame(rng))
                    with self._lock:
                        self.frames_generated += 1
                if "midfail" in text and done > 0:
                    raise RuntimeError("failed mid-stream")
                final = done + n >= total
                yield AudioChunk(np.concatenate(frames), frame_start=done, num_frames=n, is_final=final,
                                 finish_reason="eos" if final else None)
                done += n
        finally:
            with self._lock:
                self.active -= 1

    def create_voice(self, ref_audio, ref_text=None):
        import soundfile

        audio, sr = soundfile.read(ref_audio)
        if len(audio) < sr * 0.5:
            raise InputError("reference audio is shorter than 0.5 s")
        return FakeVoice(int(abs(float(np.sum(audio))) * 1000) % 1000, ref_text)
