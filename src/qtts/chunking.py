"""Stream shaping shared by :class:`qtts.api.TTS`'s bodies: frames -> chunks -> stamped chunks.

:class:`Chunker` groups frames into vocoder calls (a first chunk of ``first`` frames, then
doubling up to ``size``); :func:`stamp` adds the timing/length ``info`` of every chunk; :func:`finish` makes the
final chunk; :func:`collect` joins a stream into one :class:`~qtts.audio.Audio`;
:func:`with_speed` time-stretches a stream while it flows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from .audio import Audio, AudioChunk
from .config import FRAME_RATE, NUM_CODEBOOKS, SAMPLE_RATE


def with_speed(chunks: Iterator[AudioChunk], speed: float) -> Iterator[AudioChunk]:
    """``chunks`` time-stretched to ``speed`` while they stream (:mod:`qtts.stretch`); as they are at 1.0."""
    if speed == 1.0:
        return chunks
    from .stretch import stretch_chunks

    return stretch_chunks(chunks, speed)


def live_frames(gen, chunker: Chunker, stats: dict, t0: float) -> Iterator[AudioChunk]:
    """One live context's chunks; frames still pending go out as soon as the talker has to wait for text."""
    frames = iter(gen)
    try:
        for codes in frames:
            stats["frames"] += 1
            chunk = chunker.push(codes)
            if chunk is None and gen.waiting():
                chunk = chunker.drain()
            if chunk is not None:
                yield stamp(chunk, stats, t0)
    finally:
        frames.close()


def finish(chunker: Chunker, stats: dict, t0: float) -> AudioChunk:
    final = chunker.flush()
    final.is_final = True
    final.finish_reason = worst_reason(stats["finish_reasons"])
    return stamp(final, stats, t0, final=True)


def collect(chunks) -> Audio:
    """One :class:`Audio` (samples and codes) from a chunk stream."""
    chunks = list(chunks)
    last = chunks[-1]
    samples = np.concatenate([c.samples for c in chunks]).astype(np.float32)
    codes = np.concatenate([c.codes for c in chunks])
    return Audio(samples, SAMPLE_RATE, finish_reason=last.finish_reason, info=dict(last.info), codes=codes)


def stamp(chunk: AudioChunk, stats: dict, t0: float, final: bool = False) -> AudioChunk:
    now = time.perf_counter() - t0
    if stats["ttfa_s"] is None and len(chunk.samples):
        stats["ttfa_s"] = now
        feed = stats.get("feed")
        if feed is not None and feed.first_piece_at is not None:  # stream_text: from the first text piece
            stats["text_to_audio_s"] = time.perf_counter() - feed.first_piece_at
    info = {"frames": stats["frames"], "wall_s": now, "ttfa_s": stats["ttfa_s"]}
    if "feed" in stats:
        info["text_to_audio_s"] = stats.get("text_to_audio_s")
    if final:
        audio_s = stats["frames"] / FRAME_RATE
        info.update(audio_s=audio_s, rtf=(now / audio_s) if audio_s else None)
        if "pieces" in stats:  # generation (decode_stream has no pieces)
            info.update(pieces=stats["pieces"], finish_reasons=list(stats["finish_reasons"]))
        if "feed" in stats:
            info.update(text_wait_s=stats["waited_s"], text_chars=stats["feed"].chars)
    chunk.info = info
    return chunk


def chunk_frames_at(index: int, first: int, size: int) -> int:
    """Frames of chunk ``index``: ``first``, then doubling, capped at ``size`` (``first`` if larger).

    1, 2, 4, 8, 8, ... for the defaults: a 1-frame first chunk keeps time to first audio low, the
    doubling builds the listener's buffer, and later chunks are as cheap per frame as the vocoder
    gets (docs/performance.md). It depends on the chunk count only, never on timing.
    """
    if index == 0:
        return first
    return min(first * 2 ** min(index, 30), max(size, 1))


class Chunker:
    """Groups frames by :func:`chunk_frames_at`: ``first`` frames, then doubling up to ``size``."""

    def __init__(self, vocoder, first: int, size: int):
        self.vocoder, self.first, self.size = vocoder, first, size
        self.pending: list[np.ndarray] = []
        self.start = 0
        self.emitted = 0

    def push(self, codes: np.ndarray) -> AudioChunk | None:
        self.pending.append(codes)
        want = chunk_frames_at(self.emitted, self.first, self.size)
        return self._emit() if len(self.pending) >= want else None

    def flush(self) -> AudioChunk:
        return self._emit()

    def drain(self) -> AudioChunk | None:
        """The pending frames as a chunk now (None when there are none)."""
        return self._emit() if self.pending else None

    def _emit(self) -> AudioChunk:
        n = len(self.pending)
        codes = np.stack(self.pending).astype(np.int64) if n else np.zeros((0, NUM_CODEBOOKS), dtype=np.int64)
        if n:
            samples = np.asarray(self.vocoder.decode(codes), dtype=np.float32)
        else:
            samples = np.zeros(0, dtype=np.float32)
        chunk = AudioChunk(samples=samples, frame_start=self.start, num_frames=n, codes=codes)
        self.start += n
        self.emitted += 1
        self.pending = []
        return chunk


def worst_reason(reasons: list[str | None]) -> str:
    """One finish reason for several pieces: cancelled > runaway > length > eos."""
    for r in ("cancelled", "runaway", "length"):
        if r in reasons:
            return r
    return "eos"
