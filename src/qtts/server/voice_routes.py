"""``/v1/voices``: list uploaded voices and built-in speakers, upload a reference clip, delete."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Path, Request, UploadFile

from ..errors import InputError
from .errors import ERROR_RESPONSES, ApiError
from .voices import VOICE_ID_RE, check_voice_id, engine_speakers

log = logging.getLogger(__name__)
router = APIRouter()

#: audio containers accepted for uploads (what libsndfile reads without system tools)
UPLOAD_SUFFIXES = {"WAV": ".wav", "FLAC": ".flac", "OGG": ".ogg", "MP3": ".mp3", "AIFF": ".aiff"}
READ_CHUNK = 256 * 1024


def require_multipart(request: Request) -> None:
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "multipart/form-data":
        raise ApiError(415, f"unsupported content type {ctype.split(';')[0] or 'none'!r}: upload the reference "
                       "audio as multipart/form-data with a 'file' field", "unsupported_media_type")


@router.get("/v1/voices", responses=ERROR_RESPONSES)
async def list_voices(request: Request) -> dict:
    """Uploaded voices (type "voice") and the model's built-in speakers (type "speaker")."""
    state = request.app.state.qtts
    state.require_ready()
    data = await asyncio.to_thread(state.store.list)
    data += [{"id": s, "object": "voice", "type": "speaker"} for s in engine_speakers(state.engine)]
    return {"object": "list", "data": data}


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


def _audio_suffix(path: str) -> str:
    """Validate that ``path`` is audio libsndfile can read; the matching file suffix."""
    import soundfile

    try:
        info = soundfile.info(path)
    except (RuntimeError, ValueError, soundfile.LibsndfileError) as exc:
        raise ApiError(400, f"'file' is not readable audio ({exc}); send WAV, FLAC, OGG or MP3",
                       "invalid_audio", "file") from None
    if info.format not in UPLOAD_SUFFIXES or info.frames <= 0 or info.samplerate <= 0:
        raise ApiError(400, f"'file' has unsupported or empty audio (format {info.format}); send WAV, FLAC, "
                       "OGG or MP3", "invalid_audio", "file")
    return UPLOAD_SUFFIXES[info.format]


def _create_voice(engine, upload: str, ref_text: str | None, out_path: str, tmp_voice: str) -> None:
    """Worker-thread body: validate the clip, build the voice, write it atomically, clean up."""
    audio_path = upload
    try:
        audio_path = upload + _audio_suffix(upload)
        os.replace(upload, audio_path)
        voice = engine.create_voice(audio_path, ref_text=ref_text)
        voice.save(tmp_voice)
        os.replace(tmp_voice, out_path)
    finally:
        for p in (upload, audio_path, tmp_voice):
            if os.path.exists(p):
                os.unlink(p)


@router.post("/v1/voices", dependencies=[Depends(require_multipart)], status_code=201,
             responses={409: {"description": "A voice with that name exists"}, **ERROR_RESPONSES})
async def create_voice(
    request: Request,
    file: Annotated[UploadFile, File(description="Reference audio (WAV, FLAC, OGG, MP3; any sample rate).")],
    name: Annotated[str | None, Form(description="Voice id (1-64 of A-Z a-z 0-9 _ -); default: generated.")] = None,
    ref_text: Annotated[str | None, Form(max_length=2000, description="Transcript of the clip (ICL cloning).")] = None,
) -> dict:
    """Make a reusable voice from a reference clip; use its id as ``voice`` in /v1/audio/speech."""
    state = request.app.state.qtts
    state.require_ready()
    store = state.store
    voice_id = check_voice_id(name, "name") if name else store.new_id()
    if engine_speakers(state.engine) and voice_id.lower() in {s.lower() for s in engine_speakers(state.engine)}:
        raise ApiError(409, f"{voice_id!r} is a built-in speaker name; choose another name", "voice_exists", "name")
    upload = store.temp_path(".upload")
    out_path = store.path_for(voice_id)
    if os.path.exists(out_path):
        raise ApiError(409, f"voice {voice_id!r} exists; delete it first or choose another name",
                       "voice_exists", "name")
    tmp_voice = store.temp_path(".voice.part")
    try:
        await _save_upload(file, upload, state.settings.max_upload_bytes)
    except BaseException:
        if os.path.exists(upload):
            os.unlink(upload)
        raise
    slot = await state.scheduler.acquire()
    fut = asyncio.get_running_loop().run_in_executor(
        state.scheduler.executor, _create_voice, slot, upload, ref_text or None, out_path, tmp_voice)
    # the slot comes back when the thread is done, even if this request is cancelled meanwhile
    fut.add_done_callback(lambda _: state.scheduler.release(slot))
    try:
        await asyncio.shield(fut)
    except InputError as exc:
        raise ApiError(400, f"cannot make a voice from this clip: {exc}", "invalid_audio", "file") from None
    request.scope.setdefault("state", {}).setdefault("access", {})["voice_id"] = voice_id
    return {"id": voice_id, "object": "voice", "type": "voice", "created_at": int(time.time()),
            "ref_text": ref_text or None}


@router.delete("/v1/voices/{voice_id}", responses=ERROR_RESPONSES)
async def delete_voice(request: Request, voice_id: Annotated[str, Path(max_length=256)]) -> dict:
    """Delete an uploaded voice (built-in speakers cannot be deleted)."""
    state = request.app.state.qtts
    state.require_ready()
    if not VOICE_ID_RE.match(voice_id):
        check_voice_id(voice_id, "voice")
    if voice_id.lower() in {s.lower() for s in engine_speakers(state.engine)}:
        raise ApiError(400, f"{voice_id!r} is a built-in speaker of the model and cannot be deleted",
                       "builtin_speaker", "voice_id")
    await asyncio.to_thread(state.store.delete, voice_id)
    return {"id": voice_id, "object": "voice.deleted", "deleted": True}
