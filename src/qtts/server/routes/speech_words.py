"""Word timestamps on the server: ``timestamps: true`` on ``/v1/audio/speech`` and the live WebSocket.

The engine puts word timings on its chunks (``TTS.stream(..., timestamps=True)``,
:mod:`qtts.align.timing`); this module turns them into what the responses carry:

* :func:`timestamp_level`: ``"word"`` when the served engine has a forced aligner (loaded here, at
  start-up, so the first request does not pay the load), else ``"piece"`` (every text piece timed
  as a whole, exactly, from its frames; no word time is invented). ``/health``, ``/v1/models``,
  ``/ui/info`` and every timestamped response say which;
* :func:`heard`: the words of a chunk as dicts, without those that end after the audio the client
  got (a request cut by the frame cap);
* :func:`json_speech`: the non-streamed JSON form (``timestamps: true`` without ``stream_format:
  "sse"``): the whole file base64-encoded beside its words, as Kokoro-FastAPI's captioned speech
  (``audio``, ``audio_format``) and ElevenLabs' "with timestamps" answer.

Docs: docs/timestamps.md ("Server").
"""

from __future__ import annotations

import asyncio
import base64
import logging

from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

#: the response header that says what the times of a timestamped response time
HEADER = "X-Qtts-Timestamps"


def timestamp_level(engine) -> tuple[str, str | None]:
    """("word", None) when ``engine`` times words with a forced aligner (this loads it), else
    ("piece", None); ("piece", why) when an aligner was found (``$QTTS_ALIGNER``, the Hugging Face
    cache) but cannot load: logged, not fatal (the server serves speech; a request with timestamps
    gets 503 with the reason, :func:`check_available`). ``qtts serve --aligner`` loads it before
    this, and there a failure is the server's load error."""
    try:
        aligner = getattr(engine, "aligner", None)
    except Exception as exc:  # noqa: BLE001 (any loader failure: the server still serves speech)
        log.warning("qtts: the forced aligner cannot be loaded; requests with timestamps are refused: %s", exc)
        return "piece", f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
    return ("word" if aligner is not None else "piece"), None


def check_available(state, what: str = "'timestamps'") -> None:
    """ApiError 503 when the server's aligner failed to load (:func:`timestamp_level`)."""
    if state.timestamps_error:
        from ..errors import ApiError, public_message

        why = public_message(state.timestamps_error, getattr(state.store, "directory", None))
        raise ApiError(503, f"word timestamps are unavailable on this server: its forced aligner cannot be loaded "
                       f"({why}); send the request without {what}, or ask the operator to fix the aligner "
                       "(qtts serve --aligner DIR)", "timestamps_unavailable", "timestamps")  # fmt: skip


def heard(words, audio_s: float) -> list[dict]:
    """``words`` (:class:`qtts.align.timing.WordTiming`) as dicts, leaving out any that ends after
    ``audio_s`` seconds of sent audio (a stream cut by a frame cap: those words were not heard)."""
    return [w.to_dict() for w in words if w.end <= audio_s + 5e-4]


def shifted(words: list[dict], seconds: float, pieces: int) -> list[dict]:
    """``words`` moved ``seconds`` and ``pieces`` later: a live session's utterance is timed from its
    own start, the client's clock from the session's first audio."""
    if not seconds and not pieces:
        return words
    return [{**w, "start": round(w["start"] + seconds, 3), "end": round(w["end"] + seconds, 3),
             "piece": w["piece"] + pieces} for w in words]  # fmt: skip


async def json_speech(job, item, plan, state, request, done_event, error) -> JSONResponse:
    """The JSON form: wait for the whole file (racing the client's disconnect, which cancels the
    job), then ``{"audio", "audio_format", "sample_rate", "words", "timestamps", ...}``;
    ``done_event(plan, level)`` makes the SSE done event's fields (finish reason, usage, timestamps); ``error(exc)`` turns a failure into the ApiError to answer."""
    parts: list[bytes] = []
    words: list[dict] = []
    watch = asyncio.ensure_future(_gone(request))
    try:
        while True:
            kind, value = item
            if kind == "error":
                raise error(value)
            if kind == "end":
                break
            parts.append(value[0])
            words.extend(value[1])
            item = await _next(job, watch)
    finally:
        watch.cancel()
    level = state.timestamps
    body = {"audio": base64.b64encode(b"".join(parts)).decode(), "audio_format": plan.fmt, "sample_rate": 24000,
            "words": words, **done_event(plan, level)}  # fmt: skip
    body.pop("type", None)
    return JSONResponse(body, headers={"X-Qtts-Model": state.settings.model_id, "Cache-Control": "no-store",
                                       HEADER: level})  # fmt: skip


async def _gone(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass  # the body was read: only the disconnect (or nothing) comes


async def _next(job, watch):
    """The job's next item, or ApiError 499 when the client hangs up first."""
    from ..errors import ApiError

    item = asyncio.ensure_future(job.next())
    await asyncio.wait({item, watch}, return_when=asyncio.FIRST_COMPLETED)
    if item.done():
        return item.result()
    item.cancel()
    raise ApiError(499, "the client closed the connection before the audio was complete", "client_closed")
