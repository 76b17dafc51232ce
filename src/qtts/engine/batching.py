"""Continuous batching: one generation loop steps every active stream together.

:class:`BatchLoop` is the synchronous core (tests drive it step by step); :class:`BatchEngine`
runs it on one thread and hands each caller a :class:`BatchStream` (iterate it for frames, like a
:class:`~qtts.engine.generate.Generation`). Per-stream logic stays in :mod:`qtts.engine.generate`'s phase
functions over each stream's :class:`~qtts.engine.generate.StreamState`; :func:`predict_rows` /
:func:`advance_rows` are its ``predict`` / ``advance`` for a list of streams, one batched backend call
each. This module only decides who takes part in each step. One step:

1. admit at most one waiting stream: its prefill runs alone (batch 1), so a joining stream
   stalls the others for one prefill at most;
2. every stream whose talker logits are fresh: cancel check, code 0 (:func:`next_code0`, which
   draws the stream's own 16 uniforms), stop test (:func:`stop_reason`);
3. one batched predictor frame for those streams (:func:`predict_rows`); each frame goes to its
   stream at once, then the watchdog;
4. one batched talker step (:func:`advance_rows`) for every stream that has a frame to feed and
   is :func:`ready`; a stream that is not ready keeps its frame and is skipped until it is.

Streams join and leave between steps. A failure in one stream's prefill reaches that stream
only; a failure of a batched call reaches the streams of that call.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.base import BatchBackend
from .generate import PredictorSampler, advance, next_code0, prefill, ready, release, stop_reason, text_vector

log = logging.getLogger(__name__)

#: how long the engine thread sleeps when no stream could move (all wait for live text); a new
#: stream or a closed one wakes it at once
IDLE_WAIT_S = 0.005


@dataclass(frozen=True)
class StepStats:
    """What one step did (observers get one per step; steps run only while there are streams)."""

    rows: int  # streams in the batched talker step
    predicted: int  # streams in the batched predictor frame (= frames produced)
    seconds: float  # wall time of the whole step, prefill included
    prefill_s: float  # of which the admitted stream's prefill
    active: int  # streams held after the step
    waiting: int  # streams waiting to be admitted
    intervals: tuple = ()  # per produced frame: seconds since that stream's previous frame (or its admission)


# -- the batched phases --------------------------------------------------------------------------
def predict_rows(backend, states: list, code0s: list, lps: list, uniforms: list) -> list:
    """:func:`~qtts.engine.generate.predict` for several streams in one batched predictor frame
    (``backend.predict_frames``; a backend without it runs ``predict_frame`` per stream)."""
    for state, code0 in zip(states, code0s):
        state.history.append(int(code0))
    hidden = np.stack([s.hidden for s in states]).astype(np.float32)
    code0 = np.asarray(code0s, dtype=np.int64)
    samplers = [PredictorSampler(lp.predictor) for lp in lps]
    if isinstance(backend, BatchBackend):
        rest = backend.predict_frames(hidden, code0, samplers, np.stack(uniforms))
    else:
        rest = [backend.predict_frame(h, int(c), p, u) for h, c, p, u in zip(hidden, code0, samplers, uniforms)]
    return [np.concatenate([[c], np.asarray(r, dtype=np.int64)]).astype(np.int64) for c, r in zip(code0, rest)]


def advance_rows(backend, states: list, frames: list) -> None:
    """:func:`~qtts.engine.generate.advance` for several streams: one batched talker step, each stream at its
    own position with its own KV state (``backend.talker_rows``; a backend without it steps them one by one)."""
    if not isinstance(backend, BatchBackend):
        for state, codes in zip(states, frames):
            advance(backend, state, codes)
        return
    x = backend.frame_embeds(np.stack(frames)) + np.stack([text_vector(s) for s in states])
    logits, hidden, kvs = backend.talker_rows(x.astype(np.float32), [s.pos for s in states], [s.kv for s in states])
    for i, state in enumerate(states):
        state.logits, state.hidden, state.kv = logits[i], hidden[i], kvs[i]
        state.pos += 1


class _Row:
    """One stream inside the loop (the loop thread owns everything but ``closed``)."""

    def __init__(self, prompt, params, speaker, sink, text=None, hold=None):
        self.prompt, self.params, self.speaker, self.sink = prompt, params, speaker, sink
        self.text = text  # a live text source (qtts.text.live.LiveContext) or None
        self.hold = hold  # (n, event): after n frames the talker waits until the event is set
        self.frames = 0  # frames delivered
        self.state = None  # StreamState once admitted
        self.pending: np.ndarray | None = None  # a delivered frame the talker has not been fed yet
        self.closed = False  # set by the consumer (any thread): stop at the next step
        self.last = 0.0  # time of the previous frame (or of the admission)

    def cancelled(self) -> bool:
        cancel = self.params.cancel
        return self.closed or (cancel is not None and cancel.is_set())

    def held(self) -> bool:
        """True while the stream's first chunk is being decoded: its talker step waits (others move on)."""
        return self.hold is not None and self.frames >= self.hold[0] and not self.hold[1].is_set()


class BatchLoop:
    """The synchronous scheduler: :meth:`add` streams (any thread), :meth:`step` them (one thread)."""

    def __init__(self, backend, max_batch: int = 8, observer=None):
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend = backend
        self.max_batch = int(max_batch)
        self.observer = observer
        self.rows: list[_Row] = []  # admitted, in admission order
        self._joining: deque[_Row] = deque()  # thread-safe appends from submitters

    @property
    def busy(self) -> bool:
        return bool(self.rows or self._joining)

    @property
    def waiting(self) -> int:
        return len(self._joining)

    def add(self, prompt, params, speaker, sink, text=None, hold=None) -> _Row:
        """Queue a stream (``text``: a live text source); ``sink(kind, value)`` gets ("frame", codes [16]),
        then ("end", reason) or ("error", exc). ``hold = (n, event)``: after ``n`` frames the stream's
        talker step waits until ``event`` is set (its first chunk decoded, see :meth:`BatchEngine.first_audio`)."""
        row = _Row(prompt, params, speaker, sink, text, hold)
        self._joining.append(row)
        return row

    def step(self) -> StepStats | None:
        """One step over every stream (see the module docstring); None when there was nothing to do."""
        if not self.busy:
            return None
        t0 = time.perf_counter()
        prefill_s = self._admit()
        produced, intervals = self._frames()
        rows = self._advance()
        stats = StepStats(rows=rows, predicted=produced, seconds=time.perf_counter() - t0, prefill_s=prefill_s,
                          active=len(self.rows), waiting=len(self._joining), intervals=tuple(intervals))  # fmt: skip
        if self.observer is not None:
            try:
                self.observer(stats)
            except Exception:  # an observer never stops the loop
                log.exception("batch observer failed")
        return stats

    def close(self, reason: str = "cancelled") -> None:
        """End every stream (admitted or waiting) with ``reason``."""
        for row in list(self.rows):
            self._finish(row, reason)
        while self._joining:
            self._joining.popleft().sink("end", reason)

    # -- phases ------------------------------------------------------------------------------------
    def _admit(self) -> float:
        while self._joining and len(self.rows) < self.max_batch:
            row = self._joining.popleft()
            if row.cancelled():
                row.sink("end", "cancelled")
                continue
            t0 = time.perf_counter()
            try:
                row.state = prefill(self.backend, row.prompt, row.params, row.speaker, text=row.text)
            except Exception as exc:  # this stream's input or state: its consumer gets it
                row.sink("error", exc)
                return time.perf_counter() - t0
            row.last = time.perf_counter()
            self.rows.append(row)
            return row.last - t0
        return 0.0

    def _frames(self) -> tuple[int, list]:
        picks, code0s, uniforms = [], [], []
        for row in list(self.rows):
            if row.cancelled():
                self._finish(row, "cancelled")
                continue
            if row.pending is not None:  # its last frame is not fed yet (not ready)
                continue
            code0, u = next_code0(row.state, row.params)
            reason = stop_reason(row.state, code0, row.params)
            if reason is not None:
                self._finish(row, reason)
                continue
            picks.append(row)
            code0s.append(code0)
            uniforms.append(u)
        if not picks:
            return 0, []
        try:
            frames = predict_rows(
                self.backend, [r.state for r in picks], code0s, [r.params for r in picks], uniforms
            )
        except Exception as exc:
            self._fail(picks, exc)
            return 0, []
        now = time.perf_counter()
        intervals = []
        for row, codes in zip(picks, frames):
            intervals.append(now - row.last)
            row.last = now
            row.pending = codes
            row.frames += 1
            row.sink("frame", codes)
            watchdog = row.state.watchdog
            if watchdog is not None and watchdog.update(int(codes[0])):
                log.warning("generation stopped by the runaway watchdog after %d frames", row.state.frames)
                self._finish(row, "runaway")
        return len(picks), intervals

    def _advance(self) -> int:
        rows = [r for r in self.rows if r.pending is not None and not r.closed and not r.held() and ready(r.state)]
        if not rows:
            return 0
        try:
            advance_rows(self.backend, [r.state for r in rows], [r.pending for r in rows])
        except Exception as exc:
            self._fail(rows, exc)
            return 0
        for row in rows:
            row.pending = None
        return len(rows)

    # -- leaving ---------------------------------------------------------------------------------
    def _drop(self, row: _Row) -> None:
        if row in self.rows:
            self.rows.remove(row)
        try:
            release(self.backend, row.state)
        except Exception:
            log.exception("releasing a stream's state failed")
        row.state = None

    def _finish(self, row: _Row, reason: str) -> None:
        self._drop(row)
        row.sink("end", reason)

    def _fail(self, rows: list, exc: Exception) -> None:
        log.error("a batched step of %d stream(s) failed", len(rows), exc_info=exc)
        for row in rows:
            self._drop(row)
            row.sink("error", exc)


class BatchStream:
    """A caller's view of one stream in a :class:`BatchEngine`: iterate for frames (int64 [16]);
    ``finish_reason`` is set once iteration ends; ``close()`` stops the stream at the next step."""

    def __init__(self, engine: BatchEngine):
        self._engine = engine
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._row: _Row | None = None
        self._done = False
        self.finish_reason: str | None = None
        self.num_frames = 0

    def put(self, kind: str, value: Any) -> None:
        self._items.put((kind, value))

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> np.ndarray:
        if self._done:
            raise StopIteration
        kind, value = self._items.get()
        if kind == "frame":
            self.num_frames += 1
            return value
        self._done = True
        if kind == "end":
            self.finish_reason = value
            raise StopIteration
        raise value

    def waiting(self) -> bool:
        """True when the stream's next talker step waits for text (a live text source that is behind)."""
        state = self._row.state if self._row is not None else None
        return state is not None and not ready(state)

    def close(self) -> None:
        """Leave the batch (idempotent); frames already produced are dropped."""
        if not self._done and self._row is not None:
            self._row.closed = True
            self._engine.wake()
        self._done = True


class _WakingEvent(threading.Event):
    """An event that also wakes an engine thread when set."""

    def __init__(self, wake):
        super().__init__()
        self._wake_engine = wake

    def set(self) -> None:
        super().set()
        self._wake_engine()


class BatchEngine:
    """One :class:`BatchLoop` on its own thread, shared by every caller; :meth:`submit` is thread-safe.

    The thread starts with the first stream and sleeps while there is nothing to do.
    """

    def __init__(self, backend, max_batch: int = 8):
        self.loop = BatchLoop(backend, max_batch, self._observe)
        self.max_batch = self.loop.max_batch
        self._observers: list = []
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add_observer(self, fn) -> None:
        """``fn(StepStats)`` after every step, on the engine thread (keep it cheap)."""
        self._observers.append(fn)

    def remove_observer(self, fn) -> None:
        if fn in self._observers:
            self._observers.remove(fn)

    def submit(self, prompt, params, speaker: np.ndarray | None = None, text=None, hold=None) -> BatchStream:
        """Queue a generation (``text``: a live text source); it joins the batch at the next step
        with a free row. ``hold``: see :meth:`BatchLoop.add`."""
        stream = BatchStream(self)
        with self._lock:
            if self._closed:
                raise RuntimeError("the batch engine is closed")
            stream._row = self.loop.add(prompt, params, speaker, stream.put, text, hold)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qtts-batch", daemon=True)
                self._thread.start()
        self._wake.set()
        return stream

    def wake(self) -> None:
        self._wake.set()

    def first_audio(self) -> threading.Event:
        """An event for a stream's ``hold``: setting it (its first chunk is decoded) wakes the engine.

        As the one-stream pipeline's ``run_ahead`` hold does: a stream's first vocoder step gets the
        cores its talker step would take, so a lone stream's first audio is as early as on one engine;
        the other streams keep stepping meanwhile."""
        return _WakingEvent(self.wake)

    @property
    def active(self) -> int:
        return len(self.loop.rows)

    @property
    def waiting(self) -> int:
        return self.loop.waiting

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the thread; streams still running end with 'cancelled'."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout)
        self.loop.close()

    def _observe(self, stats: StepStats) -> None:
        for fn in list(self._observers):
            fn(stats)

    def _run(self) -> None:
        while not self._closed:
            if not self.loop.busy:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                stats = self.loop.step()
                if stats is not None and not (stats.rows or stats.predicted or stats.prefill_s):
                    self._wake.wait(IDLE_WAIT_S)  # every stream waits for text: do not spin
                    self._wake.clear()
            except Exception as exc:  # a bug in the loop itself: every stream gets it, the thread lives on
                log.exception("the batch loop failed")
                for row in list(self.loop.rows):
                    self.loop._fail([row], exc)
