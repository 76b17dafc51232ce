"""The job layer between a request and a worker, shared by every speech route: a request's voice
(alias, speaker, uploaded voice), the engine's tokenizer, the stats a job records into the metrics,
and how an engine error reaches the client. The request fields -> options
mapping and the frame cap: :mod:`qtts.engine.request`."""

from __future__ import annotations

import asyncio
import logging

from ..engine.request import Caps
from ..errors import InputError
from .errors import ApiError
from .voices import engine_speakers, is_voice_id

log = logging.getLogger(__name__)


def caps(settings) -> Caps:
    """What this server allows a request: its frame limit and its chunk size."""
    return Caps(max_frames=settings.max_frames, chunk_frames=settings.chunk_frames or None)


async def resolve_voice(name: str | None, state) -> tuple[object | None, str | None]:
    """(Voice, speaker) of a request's voice ``name``: ``--voice-alias``, speaker, uploaded voice, default
    alias (see :mod:`qtts.server.aliases`)."""
    from .aliases import OPENAI_VOICES, configured, default_target

    if name is None:
        return None, None
    speakers = engine_speakers(state.engine)
    target = configured(state.settings.voice_aliases).get(name.lower())
    if target is not None:
        return await named_voice(target, state, speakers, alias=name)
    found = await named_voice(name, state, speakers)
    if found is not None:
        return found
    target = default_target(name, speakers)
    if target is not None:
        return None, target
    known = [v["id"] for v in state.store.list()][:20] + speakers
    choices = f"this server's voices: {', '.join(known)}" if known else "this server has no voices yet"
    if name.lower() in OPENAI_VOICES:
        raise ApiError(400, f"voice {name!r} is an OpenAI voice name that this server does not map; {choices} "
                       f"(the server operator maps it with qtts serve --voice-alias {name.lower()}=VOICE)",
                       "voice_not_mapped", "voice")
    hint = choices if known else "upload one with POST /v1/voices"
    raise ApiError(404, f"unknown voice {name!r}; {hint}", "voice_not_found", "voice")


async def named_voice(name: str, state, speakers: list[str], alias: str | None = None):
    """A built-in speaker or an uploaded voice called ``name``; None when there is none (an alias
    whose target is missing is a 400)."""
    by_lower = {s.lower(): s for s in speakers}
    if name.lower() in by_lower:
        return None, by_lower[name.lower()]
    if not is_voice_id(name):
        raise ApiError(400, f"invalid voice {name!r}: ids are 1-64 characters of A-Z a-z 0-9 _ -",
                       "invalid_voice_id", "voice")
    if state.store.enabled and state.store.exists(name):
        try:
            return await asyncio.to_thread(state.store.load, name), None
        except InputError as exc:
            raise ApiError(400, f"voice {name!r} cannot be used: {exc}", "invalid_voice", "voice") from None
    if alias is not None:
        raise ApiError(400, f"voice {alias!r} is an alias of {name!r} (--voice-alias), which is neither a "
                       f"speaker of the model ({', '.join(speakers) or 'none'}) nor an uploaded voice",
                       "voice_not_mapped", "voice")
    return None


def tokenizer_of(engine):
    """The engine's text tokenizer (None: an engine with no tokenizer, a test fake)."""
    return getattr(getattr(engine, "components", None), "tokenizer", None)


def record(stats: dict, metrics) -> None:
    """A finished job's stats into the metrics: audio seconds, cancelled, real-time factor, time to audio."""
    audio_s = stats.get("audio_s", 0.0)
    metrics.audio_seconds.inc(audio_s)
    if stats.get("cancelled"):
        metrics.cancelled.inc()
    elif stats.get("completed") and audio_s > 0:
        metrics.rtf.observe(stats["gen_s"] / audio_s)
    if "ttfa_s" in stats:
        metrics.ttfa.observe(stats["ttfa_s"])


def engine_error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError):
        return ApiError(400, str(exc), "invalid_value")
    log.error("generation failed", exc_info=exc)
    return ApiError(500, f"generation failed ({type(exc).__name__}); the server log has the details",
                    "generation_failed")
