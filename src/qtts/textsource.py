"""Where ``stream_text`` gets its text: a :class:`~qtts.live.TextFeed` filled from a plain
iterable (a reader thread) or an async iterable (a task), and the async form of ``stream_text``.

A reader thread pulls the caller's iterable so that text keeps arriving while the talker
computes (with an LLM emitting 30 tokens/s, pulling only when the talker needs text would add
one token interval per wait). It stops after the piece in flight once the stream is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading

from .generate import AnyCancel
from .live import TextFeed
from .stretch import stretch_chunks

log = logging.getLogger(__name__)

#: after an async stream is closed, wait this long for its worker thread to finish the frame in flight
JOIN_S = 30.0


def start_reader(pieces, feed: TextFeed) -> threading.Thread:
    """Push every piece of the iterable ``pieces`` into ``feed`` from a daemon thread, then close it."""

    def read() -> None:
        it = iter(pieces)
        try:
            for piece in it:
                if feed.cancelled:
                    break
                feed.push(piece)
            else:
                feed.close()
        except Exception as exc:  # the caller's iterable (or bad input) failed: the stream raises it
            feed.fail(exc)
        finally:
            close = getattr(it, "close", None)
            if feed.cancelled and close is not None:
                close()

    thread = threading.Thread(target=read, name="qtts-text-reader", daemon=True)
    thread.start()
    return thread


async def astream(tts, pieces, mode, options):
    """``stream_text`` over an async iterable: text is read by a task, speech made on a thread."""
    feed = TextFeed(tts.components.tokenizer)
    options = dataclasses.replace(options, cancel=AnyCancel(options.cancel, feed))
    loop = asyncio.get_running_loop()
    out: asyncio.Queue = asyncio.Queue()

    def put(item) -> None:
        try:
            loop.call_soon_threadsafe(out.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody listens any more
            feed.cancel()

    def work() -> None:
        try:
            chunks = tts._stream_live(feed, mode, options)
            if options.speed != 1.0:  # the same stretch as TTS.stream (qtts.api.with_speed)
                chunks = stretch_chunks(chunks, options.speed)
            for chunk in chunks:
                put(("chunk", chunk))
            put(("end", None))
        except BaseException as exc:  # delivered to the async consumer
            put(("error", exc))

    async def read() -> None:
        try:
            async for piece in pieces:
                feed.push(piece)
            feed.close()
        except Exception as exc:
            feed.fail(exc)

    worker = threading.Thread(target=work, name="qtts-live", daemon=True)
    worker.start()
    reader = asyncio.ensure_future(read())
    try:
        while True:
            kind, value = await out.get()
            if kind == "chunk":
                yield value
            elif kind == "end":
                return
            else:
                raise value
    finally:
        feed.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await asyncio.to_thread(worker.join, JOIN_S)
