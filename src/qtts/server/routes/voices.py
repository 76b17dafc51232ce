"""``/v1/voices``: list uploaded voices and built-in speakers, upload a reference clip, delete.

An upload goes: name reserved (409 if taken) -> file copied to a temporary name (413 past the
byte limit) -> header checked without decoding (400 unreadable, 413 longer than the reference
limit) -> a worker slot (429/503) -> ``TTS.create_voice`` on the worker -> the voice file published
under its name. Every temporary file is removed on every path, including 429/503, a client
that leaves, and a failing worker (see ``_finish``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Annotated

from fastapi import APIRouter, File, Form, Path, Request, UploadFile

from ...errors import InputError
from ...voice import ReferenceTooLong, check_reference_header
from ..aliases import effective_table
from ..errors import ERROR_RESPONSES, ApiError
from ..voices import check_voice_id, engine_speakers, remove_quietly
from ..worker import address

log = logging.getLogger(__name__)
router = APIRouter()

#: audio containers accepted for uploads (what libsndfile reads without system tools)
UPLOAD_SUFFIXES = {"WAV": ".wav", "FLAC": ".flac", "OGG": ".ogg", "MP3": ".mp3", "AIFF": ".aiff"}
READ_CHUNK = 256 * 1024
UPLOAD = "the uploaded 'file'"


@router.get("/v1/voices", responses=ERROR_RESPONSES)
@router.get("/v1/audio/voices", responses=ERROR_RESPONSES)
async def list_voices(request: Request) -> dict:
    """Uploaded voices (type "voice") and the model's built-in speakers (type "speaker").

    ``data`` is OpenAI's list shape; ``voices`` the same ids in the shape other local TTS servers
    answer at ``/v1/audio/voices`` (``{"id", "name"}``), so their clients list them too;
    ``aliases`` maps the OpenAI voice names this server answers to the voice each one means."""
    state = request.app.state.qtts
    state.require_ready()
    data = await asyncio.to_thread(state.store.list)
    speakers = engine_speakers(state.engine)
    data += [{"id": s, "object": "voice", "type": "speaker"} for s in speakers]
    aliases = effective_table(state.settings.voice_aliases, speakers)
    return {"object": "list", "data": data, "voices": [{"id": v["id"], "name": v["id"]} for v in data],
            "aliases": aliases}


async def _save_upload(file: UploadFile, path: str, limit: int) -> int:
    """Copy the upload to ``path``; ApiError 413 past ``limit`` bytes."""
    size = 0
    with open(path, "wb") as out:
        while chunk := await file.read(READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"reference audio is larger than {limit} bytes; send a shorter clip "
                               "(3-20 s is enough)", "upload_too_large", "file")
            out.write(chunk)
    if size == 0:
        raise ApiError(400, "the uploaded 'file' is empty", "empty_file", "file")
    return size


def _about_upload(exc: Exception, *paths: str) -> str:
    """The message of ``exc`` with the server's temporary file names replaced by 'file'."""
    msg = str(exc)
    for p in paths:
        msg = msg.replace(f"reference audio '{p}'", UPLOAD).replace(p, UPLOAD)
    return msg


def _probe_upload(path: str) -> str:
    """Check the upload's header without decoding it; the file suffix of its format."""
    import soundfile

    try:
        info = soundfile.info(path)
    except (RuntimeError, ValueError, TypeError, soundfile.LibsndfileError) as exc:
        reason = getattr(exc, "error_string", None) or "unknown format"  # libsndfile's text names the path
        raise ApiError(400, f"{UPLOAD} is not readable audio ({reason}); send WAV, FLAC, OGG or MP3",
                       "invalid_audio", "file") from None
    if info.format not in UPLOAD_SUFFIXES:
        raise ApiError(400, f"{UPLOAD} is {info.format} audio; send WAV, FLAC, OGG or MP3", "invalid_audio", "file")
    try:
        check_reference_header(info, UPLOAD)
    except ReferenceTooLong as exc:
        raise ApiError(413, str(exc), "audio_too_long", "file") from None
    except InputError as exc:
        raise ApiError(400, str(exc), "invalid_audio", "file") from None
    return UPLOAD_SUFFIXES[info.format]


def _create_voice(engine, store, upload: str, suffix: str, ref_text: str | None, voice_id: str) -> None:
    """Worker-thread body: build the voice from the clip, publish it under ``voice_id``."""
    audio_path = upload + suffix
    tmp_voice = store.temp_path(".voice.part")
    try:
        os.replace(upload, audio_path)  # libsndfile picks MP3/OGG decoders by suffix too
        voice = engine.create_voice(audio_path, ref_text=ref_text)
        voice.save(tmp_voice)
        store.publish(tmp_voice, voice_id)
    except ReferenceTooLong as exc:
        raise ApiError(413, _about_upload(exc, audio_path), "audio_too_long", "file") from None
    except InputError as exc:
        raise ApiError(400, f"cannot make a voice from this clip: {_about_upload(exc, audio_path)}",
                       "invalid_audio", "file") from None
    except MemoryError:
        raise ApiError(413, f"{UPLOAD} is too large to process; send a clip of 3-10 s", "audio_too_long",
                       "file") from None
    finally:
        remove_quietly(upload, audio_path, tmp_voice)


def _clean_ref_text(ref_text: str | None) -> str | None:
    if not ref_text:
        return None
    from ...api import clean_text

    try:
        return clean_text(ref_text, what="ref_text")
    except InputError as exc:
        raise ApiError(400, str(exc), "invalid_value", "ref_text") from None


async def _run_on_worker(state, slot, owner: str, voice_id: str, upload: str, suffix: str,
                         ref_text: str | None) -> None:
    """Run ``_create_voice`` on the worker of ``slot``. Whatever happens, ``_finish`` (the done
    callback) frees the slot, the name and the temporary files, even if this request is
    cancelled while the worker still runs."""
    scheduler, store = state.scheduler, state.store

    def _finish(_fut=None) -> None:
        scheduler.release(slot, owner)
        store.unreserve(voice_id)
        remove_quietly(upload, upload + suffix)

    try:
        fut = asyncio.get_running_loop().run_in_executor(
            scheduler.executor, _create_voice, slot, store, upload, suffix, ref_text, voice_id)
    except RuntimeError:  # executor shut down: the server is stopping
        _finish()
        raise ApiError(503, "server is shutting down", "shutting_down") from None
    fut.add_done_callback(_finish)
    await asyncio.shield(fut)


@router.post("/v1/voices", status_code=201,
             responses={409: {"description": "A voice with that name exists"}, **ERROR_RESPONSES})
async def create_voice(
    request: Request,
    file: Annotated[UploadFile, File(description="Reference audio (WAV, FLAC, OGG, MP3; any common sample "
                                     "rate; 1-30 s).")],
    name: Annotated[str | None, Form(description="Voice id (1-64 of A-Z a-z 0-9 _ -); default: generated.")] = None,
    ref_text: Annotated[str | None, Form(max_length=2000, description="Transcript of the clip (ICL cloning).")] = None,
) -> dict:
    """Make a reusable voice from a reference clip; use its id as ``voice`` in /v1/audio/speech."""
    state = request.app.state.qtts
    state.require_ready()
    store, owner = state.store, address(request)
    voice_id = check_voice_id(name, "name") if name else store.new_id()
    if voice_id.lower() in {s.lower() for s in engine_speakers(state.engine)}:
        raise ApiError(409, f"{voice_id!r} is a built-in speaker name; choose another name", "voice_exists", "name")
    ref_text = _clean_ref_text(ref_text)
    upload = store.temp_path(".upload")  # 403 when uploads are disabled
    store.reserve(voice_id)  # 409 when the name exists or another upload is creating it
    try:
        await _save_upload(file, upload, state.settings.max_upload_bytes)
        suffix = await asyncio.to_thread(_probe_upload, upload)  # refused before it holds a slot
        slot = await state.scheduler.acquire_unless(request.is_disconnected, owner=owner)  # 429/503/499
    except BaseException:
        store.unreserve(voice_id)
        remove_quietly(upload)
        raise
    await _run_on_worker(state, slot, owner, voice_id, upload, suffix, ref_text)
    request.scope.setdefault("state", {}).setdefault("access", {})["voice_id"] = voice_id
    return {"id": voice_id, "object": "voice", "type": "voice", "created_at": int(time.time()),
            "ref_text": ref_text}


@router.delete("/v1/voices/{voice_id}", responses=ERROR_RESPONSES)
async def delete_voice(request: Request, voice_id: Annotated[str, Path(max_length=256)]) -> dict:
    """Delete an uploaded voice (built-in speakers cannot be deleted)."""
    state = request.app.state.qtts
    state.require_ready()
    check_voice_id(voice_id, "voice")
    if voice_id.lower() in {s.lower() for s in engine_speakers(state.engine)}:
        raise ApiError(400, f"{voice_id!r} is a built-in speaker of the model and cannot be deleted",
                       "builtin_speaker", "voice_id")
    await asyncio.to_thread(state.store.delete, voice_id)
    return {"id": voice_id, "object": "voice.deleted", "deleted": True}
