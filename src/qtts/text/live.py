"""Live text: pieces that arrive while speech is generated (``TTS.stream_text``).

:class:`TextFeed` is the one place text comes in (``push`` from any thread, ``close`` at the end
of input) and final token ids come out (:mod:`qtts.text.incremental`). The generation loop reads it
through a :class:`LiveContext`, one per talker context, which is the ``StreamState.text`` source of
:mod:`qtts.engine.generate`: ``ready(step)`` (non-blocking), ``wait(step, cancel)`` (blocking) and
``vector(step)``. In the streaming text layout the text ids form one stream ``prefix + body +
[tts_eos]`` (:class:`qtts.text.prompt.TextStream`): step ``s`` takes id ``prefill + s``; an id that is
not final yet makes the step wait (never ``tts_pad``, which tells the model the text is over).

One context spans sentences. A context holds at most ``max_tokens`` body ids, the most whose
frame budget (:func:`qtts.options.frame_budget`) fits its KV cache. Once it has taken
``max_tokens // 2`` ids, it ends at the next sentence end (``tts_eos`` goes in right after the
sentence, as if the text ended there) and the text after it starts a new context, with the same
voice, language and vocoder stream. With no sentence end before ``max_tokens`` it ends there.
A context that stops (EOS, budget, watchdog) before it took all its text also hands the rest to
a new context. Those cuts depend only on the text, never on when it arrived.

Where the text comes from: :func:`start_reader` pushes a plain iterable into a feed from a reader
thread, so that text keeps arriving while the talker computes (with an LLM emitting 30 tokens/s,
pulling only when the talker needs text would add one token interval per wait; it stops after the
piece in flight once the stream is closed); :func:`astream` reads an async iterable in a task and
runs the sync stream on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time

import numpy as np

from ..errors import InputError
from ..options import BUDGET_BASE, BUDGET_PER_TOKEN, AnyCancel, frame_budget
from .incremental import FinalTokens, hard_boundary
from .sentences import sentence_end

log = logging.getLogger(__name__)

#: a blocking wait re-checks the cancel flag this often (seconds)
POLL_S = 0.05


class TextFeed:
    """Text pieces in, final token ids out (module docstring). Thread-safe."""

    def __init__(self, tokenizer, max_chars: int | None = None):
        self.tokens = FinalTokens(tokenizer)
        self.max_chars = max_chars
        self.chars = 0
        self.closed = False  # end of input
        self.cancelled = False
        self.error: BaseException | None = None
        self.first_piece_at: float | None = None  # perf_counter of the first non-empty piece
        self.cond = threading.Condition()
        self.contexts = 0
        self._runs = 0  # tokenization runs started (FinalTokens.restart); a context reads run == its own

    # -- producer side (any thread) ------------------------------------------------------------
    def push(self, piece: str) -> None:
        """Add text; raises InputError after close() or past ``max_chars``."""
        if not isinstance(piece, str):
            raise InputError(f"text pieces must be strings, got {type(piece).__name__}")
        with self.cond:
            if self.closed:
                raise InputError("text arrived after the end of input")
            if not piece or self.cancelled:
                return
            self.chars += len(piece)
            if self.max_chars is not None and self.chars > self.max_chars:
                raise InputError(f"the text has more than {self.max_chars} characters (the limit of this stream)")
            if self.first_piece_at is None:
                self.first_piece_at = time.perf_counter()
            self.tokens.push(piece)
            self.cond.notify_all()

    def close(self) -> None:
        """End of input: everything pushed is final."""
        with self.cond:
            if not self.closed:
                self.closed = True
                self.tokens.finish()
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The text source failed: the generation raises ``exc`` at its next wait."""
        with self.cond:
            self.error = exc
            self.cond.notify_all()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()

    def is_set(self) -> bool:
        """True once cancelled (so a feed works as a cancel flag of the generation loop)."""
        return self.cancelled

    # -- consumer side (the generation thread) ---------------------------------------------------
    def next_context(self, stream, backend, max_tokens: int, budget, cancel=None):
        """Block until the next context can prefill; None when the text is over (or cancelled).

        ``stream`` is the mode's :class:`qtts.text.prompt.TextStream`; ``budget(n)`` the frame budget of
        a context whose body has ``n`` ids.
        """
        with self.cond:
            while True:
                self._raise()
                ids = self.tokens.ids
                if self.cancelled or _is_set(cancel):
                    return None
                if len(ids) >= stream.body_needed or (self.closed and ids):
                    self.contexts += 1
                    return LiveContext(self, stream, backend, max_tokens, budget)
                if self.closed:
                    if self.contexts == 0:
                        raise InputError("the text is empty (nothing to speak after removing whitespace and "
                                         "control characters)")
                    return None
                self.cond.wait(POLL_S)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error


def _is_set(cancel) -> bool:
    return cancel is not None and cancel.is_set()


class LiveContext:
    """One talker context's text: the ``StreamState.text`` source (module docstring)."""

    def __init__(self, feed: TextFeed, stream, backend, max_tokens: int, budget):
        self.feed, self.stream, self.backend = feed, stream, backend
        self.max_tokens, self.budget = max(1, max_tokens), budget
        self.run = feed._runs
        self.start = feed.tokens.run_start  # text offset of this context's first body id
        self.body: list[int] | None = None  # frozen body once the context is cut
        self.fed = 0  # stream ids the talker has taken (prefill + steps)
        self.waited_s = 0.0
        self._vectors: dict[int, np.ndarray] = {}

    # -- what the prompt needs -------------------------------------------------------------------
    def prefill_body(self) -> list[int]:
        with self.feed.cond:
            self.fed = self.stream.prefill
            return list(self._ids())

    # -- the StreamState.text protocol -----------------------------------------------------------
    def ready(self, step: int) -> bool:
        with self.feed.cond:
            return self._ready(self.stream.prefill + step)

    def wait(self, step: int, cancel=None) -> bool:
        """Block until :meth:`ready`; False when cancelled (then the loop stops)."""
        k = self.stream.prefill + step
        t0 = time.perf_counter()
        with self.feed.cond:
            try:
                while not self._ready(k):
                    self.feed._raise()
                    if self.feed.cancelled or _is_set(cancel):
                        return False
                    self.feed.cond.wait(POLL_S)
            finally:
                self.waited_s += time.perf_counter() - t0
        return True

    def vector(self, step: int) -> np.ndarray:
        """T(id) of decode step ``step`` (call after :meth:`ready` said True)."""
        k = self.stream.prefill + step
        with self.feed.cond:
            if not self._ready(k):
                raise RuntimeError(f"text for step {step} is not ready")
            tid = self._stream_id(k)
            self.fed = max(self.fed, k + 1)
            missing = tid not in self._vectors
            ahead = {int(i) for i in self._ids()[max(0, k - len(self.stream.prefix)) :]} if missing else set()
        if missing:  # embed every final id not seen yet in one backend call
            new = sorted((ahead | {tid, self.stream.eos_id, self.stream.pad_id}) - set(self._vectors))
            vectors = np.asarray(self.backend.text_embeds(np.asarray(new, np.int64)), np.float32)
            self._vectors.update(zip(new, vectors))
        return self._vectors[tid]

    def frame_limit(self, cap: int) -> int:
        """The frame budget: that of the whole body once it is complete, else ``cap``."""
        with self.feed.cond:
            return min(cap, self.budget(len(self._ids()))) if self._complete() else cap

    # -- after the generation ----------------------------------------------------------------------
    def end(self, finish_reason: str | None) -> None:
        """Hand the text this context did not take to the next context."""
        with self.feed.cond:
            if finish_reason == "cancelled" or self.run != self.feed._runs:
                return  # cancelled, or already cut (the next run started at the cut)
            tokens, taken = self.feed.tokens, max(1, self._taken())  # a context always takes one id
            if taken >= len(tokens.ids) and self.feed.closed:
                self._restart(len(tokens.text))  # all of it went in: an empty run
                return
            offset = tokens.starts[taken] if taken < len(tokens.ids) else tokens.cursor
            log.info("a talker context ended (%s) before its text did; the rest starts a new context",
                     finish_reason)
            self._restart(self._word_start(offset))

    def spoken_text(self) -> str:
        """After :meth:`end`: the text this context spoke (up to where the next context starts)."""
        with self.feed.cond:
            tokens = self.feed.tokens
            return tokens.text[self.start : max(self.start, tokens.run_start)].strip()

    # -- internals (call with the lock held) ---------------------------------------------------
    def _ids(self) -> list[int]:
        return self.body if self.body is not None else self.feed.tokens.ids

    def _complete(self) -> bool:
        return self.body is not None or self.feed.closed

    def _taken(self) -> int:
        return max(0, self.fed - len(self.stream.prefix))

    def _stream_id(self, k: int) -> int:
        prefix, ids = self.stream.prefix, self._ids()
        if k < len(prefix):
            return int(prefix[k])
        j = k - len(prefix)
        if j < len(ids):
            return int(ids[j])
        return self.stream.eos_id if j == len(ids) else self.stream.pad_id

    def _ready(self, k: int) -> bool:
        if k < len(self.stream.prefix):
            return True
        j = k - len(self.stream.prefix)
        if self.body is None and j >= self.max_tokens // 2 and not self._decide(j):
            return False
        return j < len(self._ids()) or self._complete()

    def _decide(self, j: int) -> bool:
        """Before body id ``j`` goes in: end the context at a sentence end (or at ``max_tokens``).

        False while undecided: the answer needs id ``j + 1`` (or the end of input), so that it
        depends on the text alone and not on how it was split.
        """
        tokens, closed = self.feed.tokens, self.feed.closed
        ids, starts, text = tokens.ids, tokens.starts, tokens.text
        if j >= self.max_tokens:
            self._cut(j, self._word_start(starts[j]) if j < len(ids) else tokens.cursor, [])
            return True
        if j + 1 < len(ids):
            hi = starts[j + 1]
        elif closed:
            return True  # the last id (or none): the text ends here anyway
        else:
            return False
        end = sentence_end(text, starts[j], hi)
        if end is not None:
            tail = [] if end == starts[j] else tokens.tokenizer.encode(text[starts[j] : end].rstrip())
            self._cut(j, end, tail)
        return True

    def _cut(self, j: int, offset: int, tail: list[int]) -> None:
        """Freeze the body as ids[:j] + tail (then tts_eos); the text from ``offset`` on is the next run."""
        self.body = list(self.feed.tokens.ids[:j]) + list(tail)
        log.debug("talker context ends after %d text ids (a sentence end or its size limit)", len(self.body))
        self._restart(offset)

    def _restart(self, offset: int) -> None:
        self.feed._runs += 1
        self.feed.tokens.restart(offset)
        self.feed.cond.notify_all()

    def _word_start(self, offset: int) -> int:
        """The last hard boundary at or before ``offset``, so that the next context does not start
        inside a word; ``offset`` itself when this context's text is one word (always progress)."""
        text, o = self.feed.tokens.text, offset
        while o > self.start and not hard_boundary(text[o - 1], text[o]):
            o -= 1
        return o if o > self.start else offset


def context_limits(cap: int, fixed_budget: int | None) -> tuple[int, callable]:
    """(max body ids per context, budget(n)) for a context of ``cap`` frames.

    With a fixed per-context budget (``SynthesisOptions.max_frames``) the budget is that number
    and a context holds at most ``cap`` ids (one per frame); otherwise the budget follows
    :func:`qtts.options.frame_budget` and a context holds the ids whose budget fits ``cap``.
    """
    if fixed_budget is not None:
        return max(1, int(cap)), lambda n: int(fixed_budget)
    return max(1, (int(cap) - BUDGET_BASE) // BUDGET_PER_TOKEN), lambda n: frame_budget(n, cap=cap)


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


async def astream(pieces, tokenizer, speak, options):
    """``stream_text`` over an async iterable: text is read by a task into a new feed, and
    ``speak(feed, options)`` (the sync ``stream_text`` of that feed) runs on a thread."""
    feed = TextFeed(tokenizer)
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
            for chunk in speak(feed, options):
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
