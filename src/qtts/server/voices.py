"""Voice store: uploaded voices as ``<voices_dir>/<id>.voice`` files, plus the model's speakers.

Ids match ``^[A-Za-z0-9_-]{1,64}$`` and the resolved path must sit directly inside the voices
directory, so no id can name a file elsewhere. Loaded voices are cached by (path, mtime).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid

from .errors import ApiError

log = logging.getLogger(__name__)

VOICE_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SUFFIX = ".voice"


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


def check_voice_id(voice_id: str, param: str = "voice") -> str:
    if not isinstance(voice_id, str) or not VOICE_ID_RE.match(voice_id):
        raise ApiError(400, f"invalid {param} id {voice_id!r}: ids are 1-64 characters of A-Z a-z 0-9 _ -",
                       "invalid_voice_id", param)
    return voice_id


class VoiceStore:
    """Voice files in one directory; thread-safe cache of loaded voices."""

    def __init__(self, directory: str | None, loader=None):
        #: path -> Voice; default qtts.Voice.load
        self.loader = loader
        self.directory = os.path.realpath(directory) if directory else None
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
        self._cache: dict[str, tuple[float, object]] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def path_for(self, voice_id: str) -> str:
        """The file of ``voice_id`` (validated; never outside the directory)."""
        check_voice_id(voice_id)
        if not self.directory:
            raise ApiError(404, f"unknown voice {voice_id!r}: voice uploads are disabled on this server",
                           "voice_not_found", "voice")
        path = os.path.realpath(os.path.join(self.directory, voice_id + SUFFIX))
        if os.path.dirname(path) != self.directory:
            raise ApiError(400, f"invalid voice id {voice_id!r}", "invalid_voice_id", "voice")
        return path

    def exists(self, voice_id: str) -> bool:
        return bool(self.directory) and os.path.isfile(self.path_for(voice_id))

    def list(self) -> list[dict]:
        if not self.directory:
            return []
        out = []
        for name in sorted(os.listdir(self.directory)):
            stem = name[: -len(SUFFIX)]
            if name.endswith(SUFFIX) and VOICE_ID_RE.match(stem):
                st = os.stat(os.path.join(self.directory, name))
                out.append({"id": stem, "object": "voice", "type": "voice", "created_at": int(st.st_mtime),
                            "bytes": st.st_size})
        return out

    def load(self, voice_id: str):
        """The :class:`qtts.Voice` of ``voice_id`` (cached); ApiError 404 when missing."""
        path = self.path_for(voice_id)
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            raise ApiError(404, f"unknown voice {voice_id!r}", "voice_not_found", "voice") from None
        with self._lock:
            hit = self._cache.get(path)
            if hit and hit[0] == mtime:
                return hit[1]
        loader = self.loader
        if loader is None:
            from ..voice import Voice

            loader = Voice.load
        voice = loader(path)
        with self._lock:
            self._cache[path] = (mtime, voice)
        return voice

    def new_id(self) -> str:
        return "voice_" + uuid.uuid4().hex[:12]

    def temp_path(self, suffix: str) -> str:
        if not self.directory:
            raise ApiError(403, "voice uploads are disabled: start the server with --voices DIR",
                           "uploads_disabled")
        return os.path.join(self.directory, f".upload-{uuid.uuid4().hex}{suffix}")

    def delete(self, voice_id: str) -> None:
        path = self.path_for(voice_id)
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise ApiError(404, f"unknown voice {voice_id!r}", "voice_not_found", "voice_id") from None
        with self._lock:
            self._cache.pop(path, None)
