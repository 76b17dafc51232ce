"""``POST /v1/audio/speech``: OpenAI's request fields plus qtts extras; audio streams as generated."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import logging
import threading
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from ...audio.writers import open_stream
from ...engine.request import (
    FrameCap,
    SpeechFields,
    check_max_frames,
    count_tokens,
    frame_cap,
    to_options,
    with_cancel,
)
from ...errors import InputError
from ...options import (
    MAX_PENALTY,
    MAX_SPEED,
    MAX_TEMPERATURE,
    MIN_PENALTY,
    MIN_SPEED,
    MIN_TEMPERATURE,
    AnyCancel,
)
from ...text.prompt import speakable
from ..errors import ERROR_RESPONSES, ApiError, public_message
from ..formats import MEDIA_TYPES
from ..jobs import caps, engine_error, record, resolve_voice, tokenizer_of
from ..responses import JobStreamingResponse
from ..worker import Job, address
from .speech_words import HEADER as TIMESTAMPS_HEADER
from .speech_words import check_available, heard, json_speech

log = logging.getLogger(__name__)
router = APIRouter()

Format = Literal["wav", "pcm", "flac", "mp3", "opus"]


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form: ``{"id": "voice_1234"}``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(..., max_length=256)


class SpeechRequest(BaseModel):
    """OpenAI ``audio.speech.create`` fields; the rest are qtts extras (None = model default)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, max_length=256, description="Accepted and reported; one model is served.")
    input: str = Field(..., description="Text to speak (1..max_input_chars characters).")
    voice: Annotated[str, Field(max_length=256)] | VoiceRef | None = Field(
        None, description='An uploaded voice id (GET /v1/voices), a built-in speaker name or an OpenAI '
        'voice name mapped by the alias table (alloy, nova, ...), as a string or as {"id": ...}.')
    response_format: Format | None = Field(None, description="mp3 (default, as OpenAI; the server's "
                                           "--default-format), wav, pcm (s16le 24 kHz mono), flac or opus.")
    speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False,
                                description="Speaking rate 0.25-4.0 (1.0 = unchanged): a pitch-preserving "
                                "time stretch applied while streaming.")
    stream_format: Literal["audio", "sse"] | None = Field(None, description="audio (default): the file "
                                                          "bytes, chunked; sse: base64 audio events.")
    instructions: str | None = Field(None, max_length=2000, description="OpenAI's name for `instruct`.")
    language: str | None = Field(None, max_length=64, description="'auto' or a language the model knows.")
    instruct: str | None = Field(None, max_length=2000, description="Style instruction (1.7B models).")
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Makes sampling reproducible.")
    temperature: float | None = Field(None, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, allow_inf_nan=False,
                                      description="Sampling temperature; use greedy for argmax.")
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, ge=MIN_PENALTY, le=MAX_PENALTY, allow_inf_nan=False)
    greedy: bool | None = Field(None, description="Argmax decoding (deterministic).")
    max_frames: int | None = Field(None, ge=1, description="Frame budget (12.5 frames per second), at most "
                                   "the server's max_frames.")
    timestamps: bool | None = Field(None, description="Word timings (seconds from the start of the audio): "
                                    "speech.words events with stream_format sse, else one JSON answer {audio "
                                    "(base64), audio_format, words, timestamps}; 'timestamps' says whether the "
                                    "times are per word (a forced aligner) or per text piece (none).")


@dataclasses.dataclass(frozen=True)
class SpeechPlan:
    """A validated request, ready for a worker (what it does; the job's stats are kept beside it)."""

    text: str
    fmt: str
    sse: bool
    voice: object | None
    speaker: str | None
    instruct: str | None
    language: str | None
    options: object | None
    frame_cap: int
    t0: float
    #: word timings on: chunks come as (bytes, word dicts); not SSE: one JSON answer
    timestamps: bool = False


def _check_request(req: SpeechRequest, settings) -> str:
    if not speakable(req.input):
        raise ApiError(400, "'input' is empty (only whitespace or invisible format or control characters): send "
                       "the text to speak", "empty_input", "input")
    if len(req.input) > settings.max_input_chars:
        raise ApiError(400, f"'input' has {len(req.input)} characters; the limit is {settings.max_input_chars}: "
                       "split the text into several requests", "input_too_long", "input")
    try:
        check_max_frames(req.max_frames, caps(settings))
    except InputError as exc:
        raise ApiError(400, str(exc), "max_frames_too_large", "max_frames") from None
    if req.instructions and req.instruct and req.instructions != req.instruct:
        raise ApiError(400, "'instructions' and 'instruct' differ: send only one", "conflicting_fields",
                       "instruct")
    return req.response_format or settings.default_response_format


def options_of(req, settings):
    """The validated options of a request (HTTP or a WebSocket session): ApiError 400 when invalid."""
    options = to_options(SpeechFields.of(req), caps(settings))
    try:
        options.validate()
    except InputError as exc:
        raise ApiError(400, str(exc), "invalid_value") from None
    return options


def _produce(plan: SpeechPlan, stats: dict, metrics):
    """Worker-thread body: engine chunks -> response bytes under the frame cap, into ``stats`` (the job's
    record). With timestamps: (bytes, words heard); past the cap, only the words of the audio sent."""

    def run(engine, cancel):
        cut, t_start = threading.Event(), time.perf_counter()
        stats["input_tokens"] = count_tokens(tokenizer_of(engine), plan.text)
        stream = engine.stream(plan.text, voice=plan.voice, speaker=plan.speaker, instruct=plan.instruct,
                               language=plan.language, options=with_cancel(plan.options, AnyCancel(cancel, cut)))
        chunks = FrameCap(plan.frame_cap).over(stream)
        writer = open_stream(plan.fmt)
        pending = writer.start()  # the header leaves with the first audio, after input validation
        try:
            for chunk, samples, n, capped in chunks:
                if cancel.is_set():
                    break
                if cut.is_set():  # past the cap: no more audio, the words of what was sent
                    words = heard(chunk.words, stats["audio_s"])
                    if words:
                        yield b"", words
                    continue
                metrics.frames.inc(n)
                stats["frames"] = stats.get("frames", 0) + n
                stats["audio_s"] = stats.get("audio_s", 0.0) + len(samples) / chunk.sample_rate
                stats["finish_reason"] = "length" if capped else chunk.finish_reason
                data, pending = pending + writer.write(samples), b""
                stats.setdefault("ttfa_s", time.perf_counter() - plan.t0)
                if not plan.timestamps:
                    yield data
                    if capped:
                        break
                    continue
                words = heard(chunk.words, stats["audio_s"])
                yield (data, words) if data or words else b""  # (b"": nothing to hand on)
                if capped:
                    cut.set()
            if not cancel.is_set():
                stats["completed"] = True
                data = pending + writer.finish()
                if not plan.timestamps:
                    yield data
                elif data:
                    yield data, []
        finally:
            stream.close()
            stats["gen_s"] = time.perf_counter() - t_start
            stats["cancelled"] = cancel.is_set() and not stats.get("completed")
            record(stats, metrics)

    return run


def _sse(event: dict) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _done_event(stats: dict, plan: SpeechPlan, level: str | None = None) -> dict:
    """The ``speech.audio.done`` event (``level``: what the word times time, with ``timestamps``)."""
    s = stats
    event = {"type": "speech.audio.done", "finish_reason": s.get("finish_reason"),
             "audio_seconds": round(s.get("audio_s", 0.0), 3),
             "usage": {"input_tokens": s.get("input_tokens", 0), "output_tokens": s.get("frames", 0),
                       "total_tokens": s.get("input_tokens", 0) + s.get("frames", 0)}}
    if plan.timestamps:
        event["timestamps"] = level
    return event


async def _body(job: Job, item: tuple, plan: SpeechPlan, stats: dict, state):
    """The response body: the first item, then the rest as the worker produces it."""
    while True:
        kind, value = item
        if kind == "data":
            data, words = value if plan.timestamps else (value, None)
            if plan.sse:
                if data or not words:  # (a flac delta is empty until the end; the words go on)
                    yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
                if words:
                    yield _sse({"type": "speech.words", "words": words})
            else:
                yield data
        elif kind == "end":
            if plan.sse:
                yield _sse(_done_event(stats, plan, state.timestamps))
            return
        else:
            err = engine_error(value)
            err.message = public_message(err.message, state.store.directory)
            stats["error"] = err.message
            state.metrics.errors.inc(route="/v1/audio/speech", kind="midstream")
            if plan.sse:
                yield _sse({"type": "error", "error": {"message": err.message, "type": "server_error",
                                                       "code": err.code}})
                return
            # abort the connection (no final chunk) so the client sees a truncated transfer
            raise RuntimeError(f"generation failed mid-stream: {err.message}")
        item = await job.next()


async def _first(job: Job, request: Request):
    """The job's first item, or ApiError 499 when the client hangs up before it comes (a FLAC
    response has no bytes before the end of generation, so only this watch notices; the caller
    cancels the job, which stops within a frame and is counted as cancelled)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass  # the body was read: only the disconnect (or nothing) comes

    item, watch = asyncio.ensure_future(job.next()), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({item, watch}, return_when=asyncio.FIRST_COMPLETED)
        if item.done():
            return item.result()
        raise ApiError(499, "the client closed the connection before the first audio", "client_closed")
    finally:
        for task in (item, watch):
            task.cancel()


@router.post("/v1/audio/speech", response_class=Response,
             responses={200: {"content": {m: {} for m in (*MEDIA_TYPES.values(), "text/event-stream",
                                                           "application/json")},
                              "description": "Audio bytes, streamed as they are generated (with timestamps "
                              "and no SSE: one JSON object, the audio base64-encoded beside its words)."},
                        **ERROR_RESPONSES})
async def create_speech(req: SpeechRequest, request: Request):
    """Synthesize ``input``; the body streams while the model generates."""
    state = request.app.state.qtts
    state.require_ready()
    t0 = time.perf_counter()
    fmt = _check_request(req, state.settings)
    if req.timestamps:
        check_available(state)
    voice, speaker = await resolve_voice(req.voice.id if isinstance(req.voice, VoiceRef) else req.voice, state)
    stats = request.scope.setdefault("state", {}).setdefault("access", {})
    plan = SpeechPlan(text=req.input, fmt=fmt, sse=req.stream_format == "sse", voice=voice, speaker=speaker,
                      instruct=req.instruct or req.instructions or None, language=req.language,
                      options=options_of(req, state.settings), frame_cap=frame_cap(SpeechFields.of(req), caps(state.settings)),
                      t0=t0, timestamps=bool(req.timestamps))
    owner = address(request)
    slot = await state.scheduler.acquire_unless(request.is_disconnected, owner=owner)
    job = Job(state.scheduler, slot, _produce(plan, stats, state.metrics), owner)
    job.start()
    try:
        first = await _first(job, request)
    except BaseException:
        job.cancel()
        raise
    if first[0] == "error":
        raise engine_error(first[1])
    if plan.timestamps and not plan.sse:  # the JSON form: the whole file beside its words
        try:
            return await json_speech(job, first, plan, state, request, functools.partial(_done_event, stats), engine_error)
        finally:
            job.cancel()
    media = "text/event-stream" if plan.sse else MEDIA_TYPES[fmt]
    headers = {"X-Qtts-Model": state.settings.model_id, "Cache-Control": "no-store"}
    if plan.timestamps:
        headers[TIMESTAMPS_HEADER] = state.timestamps
    return JobStreamingResponse(job, _body(job, first, plan, stats, state), media_type=media, headers=headers)
