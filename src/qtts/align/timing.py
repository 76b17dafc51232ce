"""Word times on a chunk stream: each text piece is aligned on a worker after its audio is out.

:func:`timestamped` wraps the chunks of :meth:`qtts.TTS.stream` / ``stream_text``. The generation
loop marks the end of every text piece in its frame stream (:class:`qtts.engine.stream.PieceEnd`,
recorded by :func:`qtts.engine.stream.chunks` in ``StreamStats.piece_ends`` at its frame count).
When the chunks that carry a piece's last frame have been yielded, the piece's samples (exactly
its frames: 1920 samples each) go to the aligner on its own worker thread; the frame loop never
waits for it. Finished alignments are attached, in piece order, to the next chunk that goes out
(``AudioChunk.words``), so word times never delay audio. When the stream ends with alignments
still running, its last audio goes out as an ordinary chunk at once and an empty final chunk
follows with the remaining words.

Without an aligner every piece gets one :class:`WordTiming` of unit ``"piece"``: the piece's text
with its exact start and end from the frame counts (no word time is invented). An alignment that
fails (audio too long, a missing word-split extra) falls back to the same piece timing and logs why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..config import FRAME_RATE, SAMPLES_PER_FRAME
from ..errors import QttsError

log = logging.getLogger(__name__)

#: WordTiming.unit values: a word timed by the aligner, or a whole text piece timed by its frames
WORD, PIECE = "word", "piece"


@dataclass(frozen=True)
class WordTiming:
    """A timed unit of the spoken text: seconds from the start of the stream's audio."""

    text: str
    start: float
    end: float
    #: "word" (the forced aligner's times, 80 ms steps) or "piece" (a whole text piece, exact from its frames)
    unit: str = WORD
    #: index of the text piece (sentence group or live-text context) the unit belongs to
    piece: int = 0

    def to_dict(self) -> dict:
        return {"text": self.text, "start": self.start, "end": self.end, "unit": self.unit, "piece": self.piece}


def piece_timing(text: str, index: int, start_frame: int, end_frame: int, speed: float = 1.0) -> WordTiming:
    """The exact time span of a whole piece from its frame range."""
    return WordTiming(text, round(start_frame / FRAME_RATE / speed, 3), round(end_frame / FRAME_RATE / speed, 3),
                      PIECE, index)  # fmt: skip


def word_language(language: str | None, text: str) -> str:
    """The language whose word split the aligner uses: the stream's, or for "auto" Japanese when the
    text has kana, Korean when it has Hangul, else the whitespace/CJK split of every other language."""
    lang = (language or "auto").lower()
    if lang != "auto":
        return lang
    if any("\u3040" <= ch <= "\u30ff" for ch in text):
        return "japanese"
    if any("\uac00" <= ch <= "\ud7a3" or "\u1100" <= ch <= "\u11ff" for ch in text):
        return "korean"
    return lang


def align_piece(aligner, samples: np.ndarray, sample_rate: int, text: str, language: str, index: int,
                start_frame: int, end_frame: int, speed: float = 1.0) -> list[WordTiming]:  # fmt: skip
    """Word times of one piece (offset to the stream), or its piece timing when alignment fails. A time
    is kept inside the piece's audio (the aligner's classes reach 400 s; a word cannot lie outside the
    audio it was aligned in)."""
    offset, span = start_frame / FRAME_RATE, (end_frame - start_frame) / FRAME_RATE
    try:
        words = aligner.align(samples, sample_rate, text, word_language(language, text))
    except (QttsError, ValueError, RuntimeError) as exc:
        log.warning("qtts: word timestamps for piece %d fell back to the piece's time span: %s", index, exc)
        return [piece_timing(text, index, start_frame, end_frame, speed)]

    def at(t: float) -> float:
        return round((offset + min(max(t, 0.0), span)) / speed, 3)

    return [WordTiming(w.text, at(w.start), at(w.end), WORD, index) for w in words]


class _Pieces:
    """The stream's audio since the oldest piece not yet handed out, and the pieces in flight."""

    def __init__(self, stats, worker, language: str, speed: float, sample_rate: int):
        self.stats, self.worker, self.language, self.speed = stats, worker, language, speed
        self.sample_rate = sample_rate
        self.buffer: list[np.ndarray] = []
        self.buffer_frame = 0  # frame at which self.buffer starts
        self.frames_out = 0
        self.next_piece = 0
        self.jobs: deque = deque()  # Futures (aligner) or ready lists (piece timings), in piece order

    def push(self, chunk) -> None:
        if self.worker is not None:
            self.buffer.append(np.asarray(chunk.samples, dtype=np.float32))
        self.frames_out = chunk.frame_start + chunk.num_frames
        ends = self.stats.piece_ends
        while self.next_piece < len(ends) and ends[self.next_piece][0] <= self.frames_out:
            self._start(self.next_piece, *ends[self.next_piece])
            self.next_piece += 1

    def _start(self, index: int, end_frame: int, text: str) -> None:
        start_frame = self.stats.piece_ends[index - 1][0] if index else 0
        if self.worker is None or end_frame <= start_frame:
            self.jobs.append([piece_timing(text, index, start_frame, end_frame, self.speed)] if text else [])
            return
        audio = np.concatenate(self.buffer) if self.buffer else np.zeros(0, np.float32)
        lo, hi = (start_frame - self.buffer_frame) * SAMPLES_PER_FRAME, (end_frame - self.buffer_frame) * SAMPLES_PER_FRAME
        samples = audio[lo:hi].copy()
        self.buffer, self.buffer_frame = [audio[hi:]], end_frame
        self.jobs.append(self.worker.submit(align_piece, self.worker.aligner, samples, self.sample_rate, text,
                                            self.language, index, start_frame, end_frame, self.speed))  # fmt: skip

    def ready(self, wait: bool = False) -> list[WordTiming]:
        """Words of the finished pieces at the head of the queue (all of them with ``wait``)."""
        out: list[WordTiming] = []
        while self.jobs:
            job = self.jobs[0]
            if isinstance(job, list):
                out.extend(job)
            elif wait or job.done():
                out.extend(job.result())
            else:
                break
            self.jobs.popleft()
        return out

    def cancel(self) -> None:
        for job in self.jobs:
            if not isinstance(job, list):
                job.cancel()
        self.jobs.clear()


def timestamped(chunks: Iterator, stats, worker=None, language: str = "auto", speed: float = 1.0,
                sample_rate: int = 24000) -> Iterator:  # fmt: skip
    """``chunks`` with ``AudioChunk.words`` filled (module doc); closing it closes ``chunks``.

    ``worker``: a :class:`qtts.align.runtime.AlignerWorker` (its ``aligner`` runs on its thread:
    ``submit(fn, *args)`` -> Future); None: piece timings only. ``speed``: the stream's time
    stretch (times are divided by it).
    """
    pieces = _Pieces(stats, worker, language, speed, sample_rate)
    try:
        for chunk in chunks:
            pieces.push(chunk)
            if not chunk.is_final:
                yield dataclasses.replace(chunk, words=pieces.ready())
                continue
            words = pieces.ready()
            if pieces.jobs:  # the last audio now; its words when their alignment is done
                yield dataclasses.replace(chunk, words=words, is_final=False, finish_reason=None)
                words = pieces.ready(wait=True)
                codes = None if chunk.codes is None else chunk.codes[:0]
                chunk = dataclasses.replace(chunk, samples=np.zeros(0, np.float32), codes=codes,
                                            frame_start=chunk.frame_start + chunk.num_frames, num_frames=0)  # fmt: skip
            yield dataclasses.replace(chunk, words=words)
    finally:
        pieces.cancel()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
