"""Frames -> audio chunks: the one streaming body behind ``TTS.stream``, ``stream_text`` and ``decode``.

* :func:`chunks` is **the** frames -> chunks loop: every frame goes to a :class:`Chunker`, each
  chunk it completes is stamped by the stream's :class:`StreamStats` and yielded, then the final
  chunk. ``stream`` feeds it the frames of its sentence pieces (from :func:`run_ahead`'s worker
  thread when ``options.pipeline``), ``stream_text`` the frames of its talker contexts (pending
  frames go out early while the talker waits for text: ``waiting``), ``decode`` saved frames.
* :class:`Chunker` groups frames into vocoder calls (a first chunk of ``first`` frames, then
  doubling up to ``size``: 1, 2, 4, 8, 8, ...). The schedule depends on the frame count only,
  never on timing, so the audio of a call is the same on every path.
* :func:`run_ahead`: the two-core pipeline. A worker thread runs the generation (talker +
  predictor) and hands each frame through a bounded queue; the caller's thread decodes chunk
  ``k`` while the worker already generates the frames of chunk ``k + 1``. Only the thread that
  computes a frame changes: codes, chunks and therefore audio are identical to the serial path.
* :func:`collect` joins a stream into one :class:`~qtts.audio.Audio`; :func:`with_speed`
  time-stretches a stream while it flows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..audio.chunk import Audio, AudioChunk
from ..config import FRAME_RATE, NUM_CODEBOOKS, SAMPLE_RATE
from ..options import AnyCancel

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PieceEnd:
    """A mark in a frame stream: the text piece ``text`` ends here (word timestamps align by piece)."""

    text: str


@dataclasses.dataclass
class StreamStats:
    """One stream's running record; :meth:`stamp` writes it into every chunk's ``info``."""

    #: when the stream started (perf_counter): wall_s and ttfa_s count from here
    t0: float = dataclasses.field(default_factory=time.perf_counter)
    frames: int = 0
    ttfa_s: float | None = None
    #: sentence pieces (stream) or talker contexts (stream_text); None for decode (no generation)
    pieces: int | None = None
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    #: stream_text's TextFeed (text timing), else None
    feed: Any = None
    waited_s: float = 0.0
    text_to_audio_s: float | None = None
    #: (frame count, text) at the end of every text piece, from the :class:`PieceEnd` marks in the frames
    piece_ends: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def stamp(self, chunk: AudioChunk, final: bool = False) -> AudioChunk:
        now = time.perf_counter() - self.t0
        if self.ttfa_s is None and len(chunk.samples):
            self.ttfa_s = now
            if self.feed is not None and self.feed.first_piece_at is not None:  # from the first text piece
                self.text_to_audio_s = time.perf_counter() - self.feed.first_piece_at
        info = {"frames": self.frames, "wall_s": now, "ttfa_s": self.ttfa_s}
        if self.feed is not None:
            info["text_to_audio_s"] = self.text_to_audio_s
        if final:
            audio_s = self.frames / FRAME_RATE
            info.update(audio_s=audio_s, rtf=(now / audio_s) if audio_s else None)
            if self.pieces is not None:
                info.update(pieces=self.pieces, finish_reasons=list(self.finish_reasons))
            if self.feed is not None:
                info.update(text_wait_s=self.waited_s, text_chars=self.feed.chars)
        chunk.info = info
        return chunk


def chunks(frames: Iterator[np.ndarray], chunker: Chunker, stats: StreamStats,
           waiting: Callable[[], bool] | None = None, first_decoded: threading.Event | None = None,
           ) -> Iterator[AudioChunk]:  # fmt: skip
    """The one frames -> chunks loop: stamped chunks as ``chunker`` completes them, then the final one.

    ``waiting()`` true after a frame that completed no chunk: the pending frames go out now (the
    talker waits for text). ``first_decoded`` is set after the first chunk is decoded (run_ahead's
    hold). Closing this iterator closes ``frames`` (no backend call after it). The final chunk
    carries the worst of ``stats.finish_reasons`` when the stream generated (``stats.pieces``).
    """
    try:
        for codes in frames:
            if isinstance(codes, PieceEnd):
                stats.piece_ends.append((stats.frames, codes.text))
                continue
            stats.frames += 1
            chunk = chunker.push(codes)
            if chunk is None and waiting is not None and waiting():
                chunk = chunker.drain()
            if chunk is not None:
                if first_decoded is not None:
                    first_decoded.set()
                yield stats.stamp(chunk)
    finally:
        close = getattr(frames, "close", None)
        if close is not None:
            close()
    final = chunker.flush()
    final.is_final = True
    if stats.pieces is not None:
        final.finish_reason = worst_reason(stats.finish_reasons)
    yield stats.stamp(final, final=True)


def closing_frames(gen) -> Iterator[np.ndarray]:
    """A generation's frames; closing this closes the generation (no backend call after it)."""
    frames = iter(gen)
    try:
        yield from frames
    finally:
        frames.close()


def with_speed(stream: Iterator[AudioChunk], speed: float) -> Iterator[AudioChunk]:
    """``stream`` time-stretched to ``speed`` while it flows (:mod:`qtts.audio.stretch`); as it is at 1.0."""
    if speed == 1.0:
        return stream
    from ..audio.stretch import stretch_chunks

    return stretch_chunks(stream, speed)


def collect(chunks) -> Audio:
    """One :class:`Audio` (samples and codes) from a chunk stream."""
    chunks = list(chunks)
    last = chunks[-1]
    samples = np.concatenate([c.samples for c in chunks]).astype(np.float32)
    codes = np.concatenate([c.codes for c in chunks])
    words = [w for c in chunks for w in c.words]
    return Audio(samples, SAMPLE_RATE, finish_reason=last.finish_reason, info=dict(last.info), codes=codes,
                 words=words)  # fmt: skip


def chunk_frames_at(index: int, first: int, size: int) -> int:
    """Frames of chunk ``index``: ``first``, then doubling, capped at ``size`` (``first`` if larger).

    1, 2, 4, 8, 8, ... for the defaults: a 1-frame first chunk keeps time to first audio low, the
    doubling builds the listener's buffer, and later chunks are as cheap per frame as the vocoder
    gets (docs/history/performance.md). It depends on the chunk count only, never on timing.
    """
    if index == 0:
        return first
    return min(first * 2 ** min(index, 30), max(size, 1))


class Chunker:
    """Groups frames by :func:`chunk_frames_at`: ``first`` frames, then doubling up to ``size``."""

    def __init__(self, vocoder, first: int, size: int):
        self.vocoder, self.first, self.size = vocoder, first, size
        #: the context every decode runs in (a placed stream: :meth:`qtts.backends.Placement.decoding`)
        self.place: Callable[[], Any] = contextlib.nullcontext
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
            with self.place():
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


#: frames the worker may run ahead of the decoder (backpressure: 32 frames = 2.6 s of audio)
QUEUE_FRAMES = 32
_ITEM, _DONE, _ERROR = "item", "done", "error"


def run_ahead(start: Callable[[Any], Iterator], cancel=None, depth: int = QUEUE_FRAMES,
              hold: tuple[int, threading.Event] | None = None) -> Iterator:  # fmt: skip
    """Iterate ``start(cancel_any)`` on a worker thread, at most ``depth`` items ahead of the caller.

    ``start`` gets an :class:`~qtts.options.AnyCancel` of ``cancel`` and this pipeline's own stop event and must
    check it before each item (the generation loop does, before every frame). Items arrive in
    order; an exception in the worker is re-raised here after the items it produced; the end of
    the worker's iterator ends this one. Closing this iterator (or abandoning it) sets the stop
    event, drains the queue and joins the worker, which ends within one item.

    ``hold = (n, event)``: the worker pauses after its first ``n`` items until the caller sets
    ``event`` (TTS.stream: until the first chunk is decoded, so that the first decode has both
    cores and time to first audio is the serial path's). Closing the iterator sets it too.
    """
    stop = threading.Event()
    items: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
    gate = hold or (0, None)
    worker = threading.Thread(target=_work, args=(start, AnyCancel(cancel, stop), items, gate), name="qtts-generation",
                              daemon=True)  # fmt: skip
    worker.start()
    finished = False
    try:
        while True:
            kind, item = items.get()
            if kind == _ITEM:
                yield item
                continue
            finished = True
            if kind == _ERROR:
                raise item
            return
    finally:
        stop.set()
        if gate[1] is not None:
            gate[1].set()
        while not finished:  # unblock a worker waiting on a full queue; its last message ends it
            finished = items.get()[0] != _ITEM
        worker.join()


def _work(start, cancel, items: queue.Queue, gate: tuple) -> None:
    """The worker: every item, then exactly one ``_DONE`` or ``_ERROR`` message."""
    outcome: tuple = (_DONE, None)
    hold_after, event = gate
    try:
        count = 0
        for item in start(cancel):
            items.put((_ITEM, item))
            count += not isinstance(item, PieceEnd)  # the hold counts frames
            if event is not None and count == hold_after:
                event.wait()  # set by the caller (or by closing the pipeline)
    except Exception as exc:  # re-raised on the caller's thread by run_ahead
        outcome = (_ERROR, exc)
    finally:
        items.put(outcome)
