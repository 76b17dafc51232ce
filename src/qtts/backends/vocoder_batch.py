"""The vocoder steps of many streams on one thread: :class:`VocoderBatcher`.

A batched server runs one generation thread (:class:`qtts.engine.batching.BatchEngine`) for every
stream; without this module each stream's vocoder ran on its caller's thread, so K streams meant
K vocoders competing for the cores. Here every stream's :class:`BatchedVocoderStream` hands its
``decode`` call to one batcher thread, which drives each call's step schedule
(:meth:`~qtts.backends.vocoder_step.StepStream.plan`) and, each round, runs the pending steps of
one size together in one :meth:`~qtts.backends.vocoder_step.StepVocoder.run_batch` call (their
flat caches stacked along a stream axis). Generation and vocoding overlap for all streams (two
threads), and the vocoder never oversubscribes the cores.

Order: steps of streams that have delivered no audio yet (first chunks, voice priming) go first,
then the oldest call. Each stream's state and schedule are its own, so its audio is the same as
alone (bit-identical with the default ``run_batch``, which runs the stacked steps one by one).
``close()`` frees a stream at once: its queued steps are dropped and a waiting ``decode`` raises.
Each stream records its real-time margin: audio delivered minus wall time since its first audio
(the listener's buffer, had playback started at the first chunk; negative = the listener stalls).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..config import SAMPLE_RATE
from ..errors import QttsError
from .base import VocoderStream
from .vocoder_step import drive

log = logging.getLogger(__name__)


class VocoderStreamClosed(QttsError):
    """A decode on (or waiting in) a closed :class:`BatchedVocoderStream`."""


@dataclass(frozen=True)
class VocoderCallStats:
    """One batcher call (observers get one per call)."""

    streams: int  # stacked steps in the call
    size: int  # frames per step
    first: int  # of which steps of streams that have delivered no audio yet
    seconds: float


class _Job:
    """One ``decode`` call waiting on the batcher (the batcher thread owns ``plan``/``request``)."""

    def __init__(self, stream: BatchedVocoderStream, codes: np.ndarray, seq: int):
        self.stream, self.codes, self.seq = stream, codes, seq
        self.plan = None
        self.request = None
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class BatchedVocoderStream(VocoderStream):
    """A :class:`~qtts.backends.base.VocoderStream` whose steps run on a :class:`VocoderBatcher`'s
    thread; ``decode`` blocks until its audio is ready. ``prime`` decodes audio that is thrown away
    (an ICL voice's reference codes): it counts as a first chunk but not as delivered audio."""

    def __init__(self, batcher: VocoderBatcher):
        self._batcher = batcher
        self.state = batcher.steps.stream()  # the StepStream: this stream's schedule and cache
        self.samples_per_frame = self.state.samples_per_frame
        self.started: float | None = None  # perf_counter of the first audio delivered
        self.audio_s = 0.0
        self.closed = False

    @property
    def first(self) -> bool:
        return self.started is None

    def reset(self) -> None:
        self.state.reset()
        self.started, self.audio_s = None, 0.0

    def decode(self, codes) -> np.ndarray:
        audio = self._batcher.decode(self, codes)
        if len(audio):
            if self.started is None:
                self.started = time.perf_counter()
            self.audio_s += len(audio) / SAMPLE_RATE
        return audio

    def prime(self, codes) -> np.ndarray:
        return self._batcher.decode(self, codes)

    def margin_s(self, now: float | None = None) -> float | None:
        """Audio delivered minus wall time since the first audio; None before any audio."""
        if self.started is None:
            return None
        return self.audio_s - ((time.perf_counter() if now is None else now) - self.started)

    def close(self) -> None:
        """Leave the batcher now (idempotent): queued steps are dropped, a waiting decode raises."""
        self._batcher.release(self)


class VocoderBatcher:
    """One thread that runs the vocoder steps of every :meth:`stream` it made (see the module doc).

    ``steps``: a :class:`~qtts.backends.vocoder_step.StepVocoder`; ``max_streams``: steps stacked
    in one call at most; ``observer(VocoderCallStats)`` after every call, on the batcher thread."""

    def __init__(self, steps, max_streams: int = 8, observer=None):
        if int(max_streams) < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.steps = steps
        self.max_streams = int(max_streams)
        self.observer = observer
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._streams: list[BatchedVocoderStream] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- callers (any thread) ----------------------------------------------------------------------
    def stream(self) -> BatchedVocoderStream:
        stream = BatchedVocoderStream(self)
        with self._cond:
            if self._closed:
                raise VocoderStreamClosed("the vocoder batcher is closed")
            self._streams.append(stream)
        return stream

    @property
    def active(self) -> int:
        """Streams open now (made and not closed)."""
        return len(self._streams)

    def margins(self) -> list[float]:
        """The real-time margin (seconds) of every open stream that has delivered audio."""
        now = time.perf_counter()
        with self._cond:
            streams = list(self._streams)
        return [m for m in (s.margin_s(now) for s in streams) if m is not None]

    def decode(self, stream: BatchedVocoderStream, codes) -> np.ndarray:
        """``stream``'s audio of ``codes``, run on the batcher thread (on this thread once the batcher
        is closed, so that streams still running when it closes can finish)."""
        job = _Job(stream, codes, next(self._seq))
        with self._cond:
            if stream.closed:
                raise VocoderStreamClosed("this vocoder stream is closed")
            inline = self._closed
            if not inline:
                self._jobs.append(job)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="qtts-vocoder", daemon=True)
                    self._thread.start()
                self._cond.notify()
        if inline:
            return drive(stream.state.plan(codes), self.steps.run)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def release(self, stream: BatchedVocoderStream) -> None:
        with self._cond:
            stream.closed = True
            if stream in self._streams:
                self._streams.remove(stream)
            for job in [j for j in self._jobs if j.stream is stream]:
                self._finish(job, error=VocoderStreamClosed("this vocoder stream was closed"))

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the thread once the calls queued are done; no new streams. Open streams go on
        decoding on their callers' threads."""
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)

    # -- the batcher thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    if self._closed:
                        return
                    self._cond.wait()
                group = self._pick()
            if not group:
                continue
            try:
                outs, error = self._call(group), None
            except Exception as exc:  # a failed call reaches the streams of that call
                log.error("a vocoder call of %d stream(s) failed", len(group), exc_info=exc)
                outs, error = None, exc
            with self._cond:
                for i, job in enumerate(group):
                    if job.done.is_set():  # closed while the call ran
                        continue
                    if error is not None:
                        self._finish(job, error=error)
                    else:
                        self._advance(job, (outs[0][i], outs[1][i]))

    def _pick(self) -> list[_Job]:
        """Start new calls' plans; the steps to run now: one size, first chunks then the oldest."""
        for job in [j for j in self._jobs if j.plan is None]:
            job.plan = job.stream.state.plan(job.codes)
            self._advance(job, None)
        ready = sorted(self._jobs, key=lambda j: (not j.stream.first, j.seq))
        if not ready:
            return []
        size = ready[0].request.size
        return [j for j in ready if j.request.size == size][: self.max_streams]

    def _advance(self, job: _Job, out) -> None:
        try:
            job.request = next(job.plan) if out is None else job.plan.send(out)
        except StopIteration as stop:
            self._finish(job, result=stop.value)
        except Exception as exc:  # bad codes: that call's error
            self._finish(job, error=exc)

    def _finish(self, job: _Job, result=None, error=None) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
        job.result, job.error = result, error
        job.done.set()

    def _call(self, group: list[_Job]) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        reqs = [j.request for j in group]
        size = reqs[0].size
        if len(reqs) == 1:
            audio, cache = self.steps.run(*reqs[0].args)
            outs = (np.asarray(audio, dtype=np.float32).reshape(1, -1), np.asarray(cache, dtype=np.float32).reshape(1, -1))
        else:
            stack = [np.stack([getattr(r, k) for r in reqs]) for k in ("codes", "freqs", "valid", "cache")]
            outs = self.steps.run_batch(size, *stack)
        if self.observer is not None:
            stats = VocoderCallStats(len(group), size, sum(j.stream.first for j in group), time.perf_counter() - t0)
            try:
                self.observer(stats)
            except Exception:  # an observer never stops the batcher
                log.exception("vocoder observer failed")
        return outs
