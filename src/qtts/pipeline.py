"""The two-thread pipeline behind :meth:`qtts.TTS.stream`.

* :func:`stream_chunks`: frames -> decoded, stamped chunks on the caller's thread, the frames
  coming from a worker thread (``options.pipeline``) or from the caller's thread itself. The chunk
  schedule is :class:`qtts.chunking.Chunker`'s (1, 2, 4, 8, 8, ...): it depends on the frame count
  only, never on timing, so the audio of a call is the same on both paths.
* :func:`run_ahead`: the two-core pipeline. A worker thread runs the generation (talker +
  predictor) and hands each frame through a bounded queue; the caller's thread decodes chunk
  ``k`` while the worker already generates the frames of chunk ``k + 1``. Only the thread that
  computes a frame changes: codes, chunks and therefore audio are identical to the serial path.
  Cancel, errors and the end of the stream pass through the queue in order (see the function).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .audio import AudioChunk
from .chunking import Chunker, stamp
from .generate import AnyCancel

log = logging.getLogger(__name__)

#: frames the worker may run ahead of the decoder (backpressure: 32 frames = 2.6 s of audio)
QUEUE_FRAMES = 32
_ITEM, _DONE, _ERROR = "item", "done", "error"


def run_ahead(start: Callable[[Any], Iterator], cancel=None, depth: int = QUEUE_FRAMES,
              hold: tuple[int, threading.Event] | None = None) -> Iterator:  # fmt: skip
    """Iterate ``start(cancel_any)`` on a worker thread, at most ``depth`` items ahead of the caller.

    ``start`` gets an :class:`~qtts.generate.AnyCancel` of ``cancel`` and this pipeline's own stop event and must
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
        for count, item in enumerate(start(cancel), 1):
            items.put((_ITEM, item))
            if event is not None and count == hold_after:
                event.wait()  # set by the caller (or by closing the pipeline)
    except Exception as exc:  # re-raised on the caller's thread by run_ahead
        outcome = (_ERROR, exc)
    finally:
        items.put(outcome)


def stream_chunks(frames: Callable[[Any], Iterator[np.ndarray]], chunker: Chunker, stats: dict, t0: float,
                  options) -> Iterator[AudioChunk]:  # fmt: skip
    """``frames(cancel)`` decoded by ``chunker`` into stamped chunks (not the final one).

    With ``options.pipeline`` the frames run ahead on a worker thread (:func:`run_ahead`), held
    after the first chunk's frames until that chunk is decoded, so the first decode has the
    cores to itself; else they are generated here, between decodes.
    """
    first_decoded = threading.Event()
    if options.pipeline:
        source = run_ahead(frames, options.cancel, hold=(options.first_chunk_frames, first_decoded))
    else:
        source = frames(options.cancel)
    try:
        for codes in source:
            stats["frames"] += 1
            chunk = chunker.push(codes)
            if chunk is not None:
                first_decoded.set()
                yield stamp(chunk, stats, t0)
    finally:
        source.close()


def closing_frames(gen) -> Iterator[np.ndarray]:
    """A generation's frames; closing this closes the generation (no backend call after it)."""
    frames = iter(gen)
    try:
        yield from frames
    finally:
        frames.close()
