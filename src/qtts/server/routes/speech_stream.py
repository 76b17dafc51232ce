"""``WebSocket /v1/audio/speech/stream``: speak text while the client (an LLM) is still writing it.

One answer per connection. The client sends JSON text frames: ``session.update`` (optional,
first), any number of ``text.delta``, then ``text.done``. The server sends binary frames of audio
in the session's format as it is generated, and JSON events: ``audio.started``, optional
``audio.chunk`` timings, ``words`` (with ``timestamps``: word timings, :mod:`qtts.server.routes.speech_words`),
``audio.done`` (then it closes with 1000) and ``error``. The text is
spoken in *utterances* (:mod:`qtts.server.routes.utterance`): each takes a worker slot like any request
(queued, or refused with 1013), runs :meth:`qtts.TTS.stream_text` fed from a :class:`TextPieces`
queue, so text keeps arriving while the talker computes, and gives the slot back when its text
input ends (``text.done``, a pause in the text, or, while others wait, a sentence end); a session
waiting for text between utterances holds no slot. At most ``ws_max_sessions_per_client``
sessions per client address. Closing the socket cancels the generation within a frame.
Schema, limits and close codes: docs/server.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Annotated

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...engine.request import SpeechFields, to_options
from ...errors import InputError
from ...options import MAX_PENALTY, MAX_SPEED, MAX_TEMPERATURE, MIN_PENALTY, MIN_SPEED, MIN_TEMPERATURE
from ..errors import ApiError, public_message, validation_message
from ..formats import open_format
from ..jobs import caps, resolve_voice
from ..live_limits import (
    BUSY,
    ESCAPE_FACTOR,
    MAX_JSON_DEPTH,
    MESSAGE_OVERHEAD,
    NORMAL,
    POLICY,
    TOO_BIG,
    Disconnected,
    SessionError,
    TokenBucket,
    speakable,
    too_deep,
)
from ..worker import Job, address
from .speech import Format, VoiceRef
from .speech_words import check_available
from .utterance import Utterance, Utterances

log = logging.getLogger(__name__)
access_log = logging.getLogger("qtts.server.access")
router = APIRouter()

ROUTE = "/v1/audio/speech/stream"

class SessionConfig(BaseModel):
    """``session.update`` fields (all optional; None = the model or server default)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, max_length=256)
    voice: Annotated[str, Field(max_length=256)] | VoiceRef | None = Field(
        None, description="An uploaded voice id or a built-in speaker.")
    speaker: str | None = Field(None, max_length=256, description="A built-in speaker (CustomVoice).")
    response_format: Format | None = None
    instruct: str | None = Field(None, max_length=2000)
    instructions: str | None = Field(None, max_length=2000)
    language: str | None = Field(None, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    temperature: float | None = Field(None, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, ge=MIN_PENALTY, le=MAX_PENALTY, allow_inf_nan=False)
    greedy: bool | None = None
    speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False,
                                description="Speaking rate (a pitch-preserving time stretch), as for POST.")
    max_frames: int | None = Field(None, ge=1, description="Frames of the whole session (and the budget of each "
                                   "talker context), at most the server's max_frames; None = the server's cap.")
    chunk_events: bool | None = Field(None, description="Send an audio.chunk event after each audio frame.")
    timestamps: bool | None = Field(None, description="Send words events (word timings, seconds from the session's "
                                    "first audio) between the audio frames.")


def session_options(cfg: SessionConfig, settings):
    """The options of a session's fields under this server's caps (InputError past its frame limit)."""
    return to_options(SpeechFields.of(cfg), caps(settings))


class LiveSession(Utterances):
    """One WebSocket session (module docstring); its utterances: :class:`Utterances`."""

    def __init__(self, ws: WebSocket, state):
        self.ws, self.state, self.settings = ws, state, state.settings
        self.cfg = SessionConfig()
        self.pending: list[str] = []  # text for the next utterance
        self.wants = asyncio.Event()  # there is speakable pending text, or text.done came
        self.utt: Utterance | None = None  # the utterance speaking now
        self.spoke = self.queued = False  # audio was sent; an utterance waits for a slot
        self.utterances = 0  # admitted so far
        self.writer, self.header = None, b""
        self.stats: dict = {}
        self.fmt = self.settings.default_response_format
        self.chars, self.done, self.started = 0, False, asyncio.Event()
        self.t0 = self.last_seen = self.last_text_at = time.monotonic()
        self.client: str | None = None  # the address counted in state.live_clients
        self.first_text_at: float | None = None
        self.receiver: asyncio.Task | None = None
        self.job: Job | None = None
        self.close_code: int | None = None
        self._send_lock = asyncio.Lock()
        self.rate = TokenBucket(self.settings.ws_max_messages_per_s)

    async def run(self) -> None:
        try:
            refused = self._count_client()  # before the handshake answer: in the order clients connect
            await self.ws.accept()
            self.state.require_ready()
            if refused is not None:
                raise refused
            self.receiver = asyncio.ensure_future(self._receive_loop())
            await self._race(self.started.wait())
            await self._generate()
        except ApiError as exc:  # not ready
            await self._fail(SessionError(exc.code, exc.message, BUSY))
        except SessionError as exc:
            await self._fail(exc)
        except (Disconnected, WebSocketDisconnect, OSError):
            self.close_code = self.close_code or 1006
        finally:
            await self._cleanup()

    # -- generation: a series of utterances (qtts.server.routes.utterance) ---------------------------
    async def _generate(self) -> None:
        voice, speaker, options = await self._conditioning()
        self.writer = open_format(self.fmt)
        self.header = self.writer.start()
        while not self.stats.get("capped"):
            if not self.done:
                await self._race(self.wants.wait())
            if not speakable("".join(self.pending)):
                break  # text.done with nothing (more) to say
            await self._utterance(voice, speaker, options)
        if not self.utterances:
            raise SessionError("invalid_value", "the text is empty (nothing to speak after removing whitespace and "
                               "control characters); send text.delta messages with words, then text.done")
        tail = self.header + await asyncio.to_thread(self.writer.finish)
        if tail:
            await self._send(self.ws.send_bytes(tail))
        await self._event({"type": "audio.done", "finish_reason": self.stats.get("finish_reason"),
                           "stats": self._public_stats()})
        await self._close(NORMAL)

    async def _conditioning(self):
        name = self.cfg.speaker or self.cfg.voice
        if self.cfg.speaker and self.cfg.voice:
            raise SessionError("conflicting_fields", "send either 'voice' or 'speaker', not both")
        try:
            if self.cfg.timestamps:
                check_available(self.state, "'timestamps' in session.update")
            voice, speaker = await resolve_voice(name.id if isinstance(name, VoiceRef) else name, self.state)
            options = session_options(self.cfg, self.settings)
            options.validate()
        except (ApiError, InputError) as exc:
            code = getattr(exc, "code", "invalid_value")
            raise SessionError(code, public_message(str(exc), self.state.store.directory)) from None
        return voice, speaker, options

    def _public_stats(self) -> dict:
        s = self.stats
        out = {"frames": s.get("frames", 0), "audio_s": round(s.get("audio_s", 0.0), 3), "text_chars": self.chars,
               "contexts": s.get("contexts"), "utterances": self.utterances, "ttfa_s": s.get("ttfa_s"),
               "gen_s": s.get("gen_s"),
               "text_wait_s": s.get("text_wait_s")}
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}

    # -- receiving ---------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        """Client messages until it disconnects (returns) or breaks a rule (raises SessionError)."""
        s = self.settings
        while True:
            now = time.monotonic()
            if now - self.t0 > s.ws_max_session_s:
                raise SessionError("session_too_long", f"the session passed its limit of {s.ws_max_session_s:g} s")
            # the last progress: text that changes the speech, or audio sent; not counted while an
            # utterance waits for a slot or speaks (it ends by itself: a pause, its budget)
            idle, counted = now - self.last_seen, not self.done and not self.queued and self.utt is None
            if counted and idle > s.ws_idle_timeout_s:
                raise SessionError("idle_timeout", f"no new text and no audio for {s.ws_idle_timeout_s:g} s (empty, "
                                   "blank and unknown messages do not count); send text.delta messages and end with "
                                   "text.done")
            wait = min(s.ws_idle_timeout_s - idle, 1.0) if counted else 1.0
            try:
                message = await asyncio.wait_for(self.ws.receive(), max(0.01, wait))
            except asyncio.TimeoutError:
                continue
            if message["type"] == "websocket.disconnect":
                return
            if not self.rate.take():
                raise SessionError("too_many_messages", f"more than {s.ws_max_messages_per_s:g} messages per second; "
                                   "send fewer, larger text.delta pieces")
            if message.get("text") is None:
                await self._event(_error("binary_not_supported", "binary frames are not accepted: send JSON text "
                                         "frames (session.update, text.delta, text.done)"))
                continue
            try:
                await self._handle(message["text"])
            except SessionError as exc:
                if exc.close is not None:
                    raise
                await self._event(_error(exc.code, exc.message))  # reported; the session goes on

    async def _handle(self, text: str) -> None:
        limit = ESCAPE_FACTOR * self.settings.ws_max_message_chars + MESSAGE_OVERHEAD
        if len(text) > limit:
            raise SessionError("delta_too_long", f"a message has {len(text)} characters; the limit is {limit}: send "
                               "smaller text.delta pieces", TOO_BIG)
        try:
            msg = json.loads(text)
            deep = too_deep(msg)
        except (ValueError, RecursionError):
            msg, deep = None, True
        if deep:
            return await self._event(_error("invalid_json", "a message is not valid JSON (or nests more than "
                                            f"{MAX_JSON_DEPTH} levels); send "
                                            '{"type": "text.delta", "delta": "..."}'))
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind == "text.delta":
            return self._delta(msg)
        if kind == "text.done":
            self.done = True
            if self.utt is not None:
                self.utt.close()
            self.wants.set()
            self.started.set()
            return None
        if kind == "session.update":
            return await self._update(msg)
        await self._event(_error("unknown_type", f"unknown message type {str(kind)[:40]!r}; use session.update, "
                                 "text.delta or text.done"))
        return None

    def _delta(self, msg: dict) -> None:
        s, delta = self.settings, msg.get("delta")
        if set(msg) - {"type", "delta"} or not isinstance(delta, str):
            raise SessionError("invalid_delta", "text.delta takes one string field 'delta'")
        if self.done:
            raise SessionError("text_after_done", "text.delta after text.done is ignored", close=None)
        if len(delta) > s.ws_max_message_chars:
            raise SessionError("delta_too_long", f"a text.delta has {len(delta)} characters; the limit is "
                               f"{s.ws_max_message_chars} per message: send smaller pieces", TOO_BIG)
        self.chars += len(delta)
        if self.chars > s.ws_max_session_chars:
            raise SessionError("session_text_too_long", f"the session's text passed {s.ws_max_session_chars} "
                               "characters; start a new session for more")
        if delta:
            self.first_text_at = self.first_text_at or time.monotonic()
            if speakable(delta):
                self._progress()
                self.last_text_at = self.last_seen
            self._give(delta)
        self.started.set()

    async def _update(self, msg: dict) -> None:
        if self.started.is_set():
            raise SessionError("session_started", "session.update must come before the first text", close=None)
        if set(msg) - {"type", "session"} or not isinstance(msg.get("session"), dict):
            raise SessionError("invalid_session", 'session.update takes {"session": {...}}')
        try:
            self.cfg = SessionConfig(**msg["session"])
        except (ValidationError, TypeError) as exc:
            errors = exc.errors() if isinstance(exc, ValidationError) else [{"msg": str(exc)}]
            raise SessionError("invalid_session", validation_message(errors)[0]) from None
        self.fmt = self.cfg.response_format or self.settings.default_response_format
        self._progress()
        self.started.set()  # the voice is known (checked now); a worker is taken only for text

    def _progress(self) -> None:
        """Something that changes the answer happened: the idle timer starts again."""
        self.last_seen = time.monotonic()

    # -- plumbing ----------------------------------------------------------------------------
    async def _race(self, awaitable):
        """``awaitable``'s result, unless the receiver ends first (disconnect or a broken rule)."""
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({task, self.receiver}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ApiError):
            await task
        exc = self.receiver.exception()
        raise exc if exc is not None else Disconnected()

    async def _event(self, event: dict) -> None:
        await self._send(self.ws.send_text(json.dumps(event)))

    async def _send(self, coro) -> None:
        async with self._send_lock:
            try:
                await asyncio.wait_for(coro, self.settings.write_timeout_s)
            except (asyncio.TimeoutError, RuntimeError, OSError, WebSocketDisconnect) as exc:
                raise Disconnected() from exc

    async def _fail(self, exc: SessionError) -> None:
        self.stats["error"] = exc.message
        with contextlib.suppress(Disconnected):
            await self._event(_error(exc.code, exc.message))
        await self._close(exc.close or POLICY)

    async def _close(self, code: int) -> None:
        self.close_code = code
        self._uncount()  # its last message is sent: a client may open its next session at once
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code), 5)

    def _count_client(self) -> SessionError | None:
        """At most ``ws_max_sessions_per_client`` sessions from one address: count this one, or the
        refusal (1013) to send once the socket is accepted."""
        host = address(self.ws)
        live, cap = self.state.live_clients, self.settings.ws_max_sessions_per_client
        if live.get(host, 0) >= cap:
            return SessionError("too_many_sessions", f"{live[host]} live sessions are open from {host}, the limit "
                                f"per client address ({cap}); finish one first, or retry shortly", BUSY)
        live[host], self.client = live.get(host, 0) + 1, host
        self.state.metrics.live_sessions.set(sum(live.values()))
        return None

    def _uncount(self) -> None:
        """This session no longer counts against its address's ``ws_max_sessions_per_client``."""
        if self.client is not None:
            live = self.state.live_clients
            live[self.client] -= 1
            if not live[self.client]:
                del live[self.client]
            self.client = None
            self.state.metrics.live_sessions.set(sum(live.values()))

    async def _cleanup(self) -> None:
        if self.utt is not None:
            self.utt.close()
        self._uncount()
        if self.receiver is not None:
            self.receiver.cancel()
            with contextlib.suppress(BaseException):
                await self.receiver
        if self.job is not None:
            self.job.cancel()
            await self.job.wait_done(30)
        m = self.state.metrics
        m.requests.inc(route=ROUTE, method="WS", status=str(self.close_code or 1006))
        if self.settings.access_log:
            record = {"path": ROUTE, "close_code": self.close_code or 1006, "text_chars": self.chars,
                      "duration_ms": round(1000 * (time.monotonic() - self.t0), 1), **self._public_stats()}
            if "error" in self.stats:
                record["error"] = self.stats["error"]
            access_log.info(json.dumps(record, ensure_ascii=True))


def _error(code: str, message: str) -> dict:
    return {"type": "error", "error": {"code": code, "message": message}}


@router.websocket(ROUTE)
async def speech_stream(ws: WebSocket) -> None:
    """Live speech from streaming text (module docstring, docs/server.md)."""
    await LiveSession(ws, ws.app.state.qtts).run()
