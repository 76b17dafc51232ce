"""One utterance of a live speech session: a generation that holds a worker slot only while it speaks.

A WebSocket session (:mod:`qtts.server.routes.speech_stream`) is a series of utterances. Each one is
admitted like any request (a slot from :class:`qtts.server.worker.Scheduler`, or a place in its
queue, or refused), runs one ``TTS.stream_text`` call fed by its own :class:`TextPieces`, and gives
its slot back when that call ends. The session decides when an utterance's text input ends
(:meth:`Utterance.close`: the talker then speaks the text it has and stops): at ``text.done``, after
a pause in the text, or, while other requests wait, at a sentence end or when the utterance waits
for text (docs/operations.md, "Live sessions and capacity"). :func:`cut_point` finds where in a new
piece of text an utterance may end; :func:`produce` is the worker-thread body.
"""

from __future__ import annotations

import asyncio
import threading
import time
import unicodedata

from ...engine.request import FrameCap, with_cancel
from ...options import AnyCancel
from ...text.sentences import sentence_end
from ..errors import ApiError, public_message
from ..jobs import engine_error
from ..jobs import record as record_stats
from ..live_limits import BUSY, INTERNAL, POLICY, SessionError, TextPieces, speakable
from ..worker import Job, address
from .speech_words import heard, shifted

#: how often a speaking utterance checks whether its text input should end (seconds)
CHECK_S = 0.1
#: characters of an utterance's text kept to find a sentence end that spans two pieces
TAIL = 64
#: an utterance ends at the first sentence end after this many characters, or at the first word
#: boundary after MAX_CHARS (about 30 s of speech), so that no utterance holds a slot for long
SENTENCE_AFTER_CHARS, MAX_CHARS = 300, 400
#: while others wait for a slot: at the next sentence end, or the first word boundary after this
#: many characters (about 10 s of speech)
MAX_WAITED_CHARS = 160


class Utterance:
    """Event-loop side of one utterance: its text input and what it has made so far."""

    def __init__(self, later: bool):
        self.pieces = TextPieces()
        self.later = later  # not the session's first (admitted after first requests)
        self.tail = ""  # the last TAIL characters given to the talker
        self.chars = 0  # characters given to the talker
        self.words = False  # some of them are speakable
        self.closed = False  # the text input ended
        self.admitted = time.monotonic()
        self.audio_s = 0.0  # audio made so far
        self.yield_since: float | None = None  # asked to end at the next word boundary since then

    def push(self, text: str) -> None:
        if text:
            self.pieces.push(text)
            self.tail = (self.tail + text)[-TAIL:]
            self.chars += len(text)
            self.words = self.words or speakable(text)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pieces.close()

    def behind_s(self) -> float:
        """Seconds the utterance has held its slot beyond the audio it made (it waits for text)."""
        return time.monotonic() - self.admitted - self.audio_s


class Utterances:
    """The utterance steps of :class:`qtts.server.routes.speech_stream.LiveSession` (its state: ``pending``,
    ``utt``, ``wants``, ``utterances``, ``spoke``, ``queued``, ``last_text_at``, ``header``, ``job``)."""

    async def _utterance(self, voice, speaker, options) -> None:
        """Admit one utterance (a slot, a queue place, or 1013), feed it, forward its audio."""
        utt = Utterance(later=self.utterances > 0)
        owner = address(self.ws)
        self.queued = True
        try:
            slot = await self._race(self.state.scheduler.acquire(later=utt.later, owner=owner))
        except ApiError as exc:
            raise SessionError(exc.code, exc.message, BUSY) from None
        finally:
            self.queued = False
        utt.admitted = self.last_seen = time.monotonic()  # (admission counts as progress)
        self.utt, self.utterances = utt, self.utterances + 1
        text, self.pending = "".join(self.pending), []
        self.wants.clear()
        self._give(text)
        if self.done:
            utt.close()
        self.job = Job(self.state.scheduler, slot, produce(self, utt, voice, speaker, options), owner)
        self.job.start()
        try:
            await self._forward(utt)
        finally:
            self.utt = None
            utt.close()
        await self.job.wait_done(30)  # its worker is out of the writer before the next one starts

    def _give(self, text: str) -> None:
        """New text: to the utterance now speaking, unless it should end first (module docstring
        of qtts.server.routes.utterance, :func:`end_point`); the rest waits for the next utterance."""
        utt = self.utt
        if utt is None or utt.closed:
            self.pending.append(text)
            if speakable(text) or self.done:
                self.wants.set()
            return
        cut = end_point(utt, text, self.state.scheduler.queue_depth > 0, utt.yield_since is not None)
        if cut is None or not (utt.words or speakable(text[:cut])):  # (an utterance of only "\n\n": none)
            return utt.push(text)
        utt.push(text[:cut])
        utt.close()
        return self._give(text[cut:])

    def _check(self, utt: Utterance) -> None:
        """Every CHECK_S while an utterance speaks: end its text input after a pause, or when it
        waits for text while others wait for a slot (then at a word boundary, within one gap)."""
        if utt.closed:
            return
        now, gap = time.monotonic(), self.settings.ws_utterance_gap_s
        if now - max(self.last_text_at, utt.admitted) >= gap:
            utt.close()  # a pause: the text so far is this utterance
        elif utt.yield_since is None and self.state.scheduler.queue_depth and utt.behind_s() > gap:
            utt.yield_since = now
            if at_boundary(utt.tail):
                utt.close()
        elif utt.yield_since is not None and now - utt.yield_since >= gap:
            utt.close()

    async def _forward(self, utt: Utterance) -> None:
        get = None
        while True:
            get = get or asyncio.ensure_future(self.job.next())
            done, _ = await asyncio.wait({get, self.receiver}, timeout=CHECK_S, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                if self.receiver in done:
                    await self._race(get)  # raises the receiver's error (or Disconnected)
                self._check(utt)
                continue
            (kind, value), get = get.result(), None
            if kind == "error":
                exc = engine_error(value)
                close = POLICY if exc.status < 500 else INTERNAL
                raise SessionError(exc.code, public_message(exc.message, self.state.store.directory), close)
            if kind == "end":
                return
            data, info = value
            utt.audio_s += info.pop("audio_s")
            words = info.pop("words", None)
            if data:
                await self._audio(data)
            if self.cfg.chunk_events and info:  # (none for the words after a cut)
                await self._event({"type": "audio.chunk", **info, "wall_s": round(time.monotonic() - self.t0, 4)})
            if words:
                await self._event({"type": "words", "words": words})
            self._check(utt)

    async def _audio(self, data: bytes) -> None:
        if not self.spoke:
            self.spoke = True
            if self.first_text_at is not None:
                self.stats["ttfa_s"] = time.monotonic() - self.first_text_at
                self.state.metrics.ttfa.observe(self.stats["ttfa_s"])
            started = {"type": "audio.started", "response_format": self.fmt, "sample_rate": 24000}
            if self.cfg.timestamps:
                started["timestamps"] = self.state.timestamps  # "word", or "piece" without an aligner
            await self._event(started)
        data, self.header = self.header + data, b""
        await self._send(self.ws.send_bytes(data))
        self.last_seen = time.monotonic()


def at_boundary(text: str) -> bool:
    """True when ``text`` ends between words (whitespace or punctuation), or is empty."""
    return not text or text[-1].isspace() or unicodedata.category(text[-1])[0] == "P"


def cut_point(tail: str, new: str, sentence: bool) -> int | None:
    """Where in ``new`` (text that follows ``tail``) an utterance may end: after its first sentence
    end (``sentence``), else at its first word boundary; None when ``new`` has none yet."""
    if sentence:
        full = tail + new
        end = sentence_end(full, len(tail), _known(full))
        return None if end is None else max(0, end - len(tail))
    if at_boundary(tail):
        return 0
    return next((i for i, ch in enumerate(new) if ch.isspace() or unicodedata.category(ch)[0] == "P"), None)


def _known(text: str) -> int:
    """The ``hi`` of :func:`sentence_end` for a text that may still grow: a terminator at the very
    end may be "3." of "3.5" (wait for the next character); one followed by whitespace is final."""
    return len(text) if text and text[-1].isspace() else len(text) - 1


def end_point(utt: Utterance, new: str, waiting: bool, yielding: bool) -> int | None:
    """Where in ``new`` ``utt`` ends, or None (``new`` goes to it whole). ``yielding`` (it waits for
    text while others wait for a slot): at the first word boundary. Else at the first sentence end
    past SENTENCE_AFTER_CHARS (``waiting``: any sentence end), or at the first word boundary past
    MAX_CHARS (``waiting``: MAX_WAITED_CHARS)."""
    if yielding:
        return cut_point(utt.tail, new, sentence=False)
    soft, hard = (0, MAX_WAITED_CHARS) if waiting else (SENTENCE_AFTER_CHARS, MAX_CHARS)
    full = utt.tail + new
    end = sentence_end(full, len(utt.tail) + max(0, soft - utt.chars), _known(full))
    if end is not None:
        return end - len(utt.tail)
    room = max(0, hard - utt.chars)
    if len(new) <= room:
        return None
    cut = cut_point((utt.tail + new[:room])[-TAIL:], new[room:], sentence=False)
    return None if cut is None else room + cut


def produce(session, utt: Utterance, voice, speaker, options):
    """Worker-thread body for ``utt``: engine chunks -> (audio bytes, chunk info). The session's
    stats (frames, audio, contexts, finish reason) add up over its utterances; ``max_frames``
    caps the whole session (``stats["capped"]`` once reached). With timestamps, a stream cut at the
    cap stops generating (``cut``) and still hands out the words of the audio sent (info ``words``)."""
    cfg, stats, metrics, writer = session.cfg, session.stats, session.state.metrics, session.writer
    cap = cfg.max_frames or session.settings.max_frames

    def run(engine, cancel):
        record, t0, cut = {"audio_s": 0.0}, time.perf_counter(), threading.Event()
        # word times count from the session's first audio, pieces over the session's contexts
        at = (stats.get("audio_s", 0.0), stats.get("contexts", 0))
        stream = engine.stream_text(utt.pieces, voice=voice, speaker=speaker, language=cfg.language,
                                    instruct=cfg.instruct or cfg.instructions or None,
                                    options=with_cancel(options, AnyCancel(cancel, cut)))
        try:
            for chunk in stream:
                if cancel.is_set():
                    break
                if cut.is_set():
                    if words := shifted(heard(chunk.words, record["audio_s"]), *at):
                        yield b"", {"audio_s": 0.0, "words": words}
                    continue
                start = stats.get("frames", 0)
                taken = FrameCap(cap, start)
                samples, n, capped = taken.take(chunk)
                metrics.frames.inc(n)
                seconds = len(samples) / chunk.sample_rate
                stats["frames"], record["audio_s"] = start + n, record["audio_s"] + seconds
                stats["audio_s"] = stats.get("audio_s", 0.0) + seconds
                if chunk.is_final or capped:
                    _finish(stats, chunk, capped, taken.full)
                info = {"frame_start": start, "frames": n, "audio_s": seconds}
                if options.timestamps:
                    info["words"] = shifted(heard(chunk.words, record["audio_s"]), *at)
                yield writer.write(samples), info
                if capped:  # with timestamps: no more frames, the words of what was sent still come
                    if not options.timestamps:
                        break
                    cut.set()
            record["completed"] = not cancel.is_set()
        finally:
            stream.close()
            utt.close()
            record["gen_s"] = time.perf_counter() - t0
            stats["gen_s"] = stats.get("gen_s", 0.0) + record["gen_s"]
            record["cancelled"] = cancel.is_set() and not record.get("completed")
            record_stats(record, metrics)

    return run


def _finish(stats: dict, chunk, capped: bool, full: bool) -> None:
    """An utterance's last chunk (``capped``: cut at the session cap, ``full``: the cap is
    reached): add its contexts and text wait to the session's stats."""
    info = chunk.info or {}
    stats["contexts"] = stats.get("contexts", 0) + (info.get("pieces") or 0)
    stats["text_wait_s"] = stats.get("text_wait_s", 0.0) + (info.get("text_wait_s") or 0.0)
    stats["finish_reason"] = "length" if capped else chunk.finish_reason
    stats["capped"] = stats.get("capped", False) or full
