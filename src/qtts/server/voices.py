"""The voice store as the HTTP server answers it: :class:`qtts.voice.store.VoiceStore` with its
refusals raised as :class:`ApiError` (400 invalid id, 403 uploads disabled, 404 unknown voice, 409
exists / not a voice), plus the model's built-in speakers and languages.

Everything the store does to its folder (ids, reservations, atomic publish, delete, the stale-upload
sweep) lives in :mod:`qtts.voice.store`; this module only maps its errors to HTTP.
"""

from __future__ import annotations

import functools

from ..voice import store as _store
from ..voice.store import SUFFIX, TEMP_PREFIX, VOICE_ID_RE, StoreError, is_voice_id, remove_quietly
from .errors import ApiError

__all__ = ["SUFFIX", "TEMP_PREFIX", "VOICE_ID_RE", "VoiceStore", "api_error", "check_voice_id", "engine_languages",
           "engine_speakers", "is_voice_id", "remove_quietly"]  # fmt: skip

#: store refusal -> HTTP status
STATUS = {
    _store.InvalidVoiceId: 400,
    _store.StoreDisabled: 403,
    _store.UnknownVoice: 404,
    _store.VoiceExists: 409,
    _store.NotAVoice: 409,
}


def api_error(exc: StoreError) -> ApiError:
    """The HTTP answer to a store refusal (same message; the field it names as ``param``)."""
    return ApiError(STATUS.get(type(exc), 400), str(exc), exc.code, exc.field)


def _answered(method):
    """``method`` of the store with its StoreErrors raised as ApiErrors."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except StoreError as exc:
            raise api_error(exc) from None

    return call


def check_voice_id(voice_id: str, param: str = "voice") -> str:
    """``voice_id`` when it is a valid id; ApiError 400 naming ``param`` otherwise."""
    return _answered(_store.check_voice_id)(voice_id, param)


class VoiceStore(_store.VoiceStore):
    """:class:`qtts.voice.store.VoiceStore` whose refusals are ApiErrors."""

    path_for = _answered(_store.VoiceStore.path_for)
    exists = _answered(_store.VoiceStore.exists)
    load = _answered(_store.VoiceStore.load)
    temp_path = _answered(_store.VoiceStore.temp_path)
    reserve = _answered(_store.VoiceStore.reserve)
    publish = _answered(_store.VoiceStore.publish)
    add = _answered(_store.VoiceStore.add)
    delete = _answered(_store.VoiceStore.delete)


def engine_speakers(engine) -> list[str]:
    """The model's built-in speaker names (CustomVoice checkpoints); [] for Base models."""
    speakers = getattr(engine, "speakers", None) or []
    if callable(speakers):
        speakers = speakers()
    return sorted(str(s) for s in speakers)


def engine_languages(engine) -> list[str]:
    langs = getattr(engine, "languages", None) or []
    if callable(langs):
        langs = langs()
    return sorted(str(x) for x in langs)
