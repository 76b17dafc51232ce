"""Voice store: uploaded voices as ``<voices_dir>/<id>.voice`` files, plus the model's speakers.

Ids are 1-64 characters of ``A-Z a-z 0-9 _ -`` (whole-string match: no trailing newline) and
the path sits directly inside the voices directory, so no id can name a file elsewhere. Only
regular files are voices: symlinks are never followed, listed or served, and ``DELETE`` removes
the named entry only (a symlink itself, never its target). Listing and loading survive files that
vanish or change meanwhile (:mod:`qtts.voice.folder`); loaded voices are cached by file identity
(inode, size, mtime and ctime in ns), so a file replaced with its old mtime is read again. A name being created is *reserved* (under
a lock) from before its upload is read until its file is published with ``os.link`` (which
fails if the name exists), so of two racing uploads with one name exactly one wins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import threading
import time
import uuid

from ..voice.folder import VoiceFileCache, VoiceFileMissing, regular_entries
from .errors import ApiError

log = logging.getLogger(__name__)

#: use with ``fullmatch`` (``$`` would also match before a final newline)
VOICE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
SUFFIX = ".voice"
TEMP_PREFIX = ".upload-"
#: temporary upload files older than this are removed when a store opens (left by a crash)
STALE_TEMP_S = 3600.0


def is_voice_id(value) -> bool:
    return isinstance(value, str) and VOICE_ID_RE.fullmatch(value) is not None


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
    if not is_voice_id(voice_id):
        raise ApiError(400, f"invalid {param} id {voice_id!r}: ids are 1-64 characters of A-Z a-z 0-9 _ -",
                       "invalid_voice_id", param)
    return voice_id


class VoiceStore:
    """Voice files in one directory; thread-safe cache of loaded voices."""

    def __init__(self, directory: str | None, loader=None):
        self.directory = os.path.realpath(directory) if directory else None
        self._cache = VoiceFileCache(loader)
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
            self._sweep_stale()

    @property
    def loader(self):
        """path -> Voice (tests); None: the voice file's own bytes (:class:`qtts.voice.folder.VoiceFileCache`)."""
        return self._cache.loader

    @loader.setter
    def loader(self, value) -> None:
        self._cache.loader = value

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def path_for(self, voice_id: str) -> str:
        """The file of ``voice_id`` (validated; never outside the directory)."""
        check_voice_id(voice_id)
        if not self.directory:
            raise ApiError(404, f"unknown voice {voice_id!r}: voice uploads are disabled on this server",
                           "voice_not_found", "voice")
        path = os.path.join(self.directory, voice_id + SUFFIX)  # not resolved: a symlink is not followed
        if os.path.dirname(path) != self.directory:
            raise ApiError(400, f"invalid voice id {voice_id!r}", "invalid_voice_id", "voice")
        return path

    def exists(self, voice_id: str) -> bool:
        """True when ``voice_id`` is a regular file (not a symlink) in the directory."""
        if not self.directory:
            return False
        try:
            return stat.S_ISREG(os.lstat(self.path_for(voice_id)).st_mode)
        except OSError:
            return False

    def list(self) -> list[dict]:
        if not self.directory:
            return []
        return [{"id": stem, "object": "voice", "type": "voice", "created_at": int(st.st_mtime), "bytes": st.st_size}
                for stem, st in regular_entries(self.directory, SUFFIX) if is_voice_id(stem)]

    def load(self, voice_id: str):
        """The :class:`qtts.Voice` of ``voice_id`` (cached); ApiError 404 when missing."""
        path = self.path_for(voice_id)
        try:
            return self._cache.load(path)
        except VoiceFileMissing:
            raise ApiError(404, f"unknown voice {voice_id!r}", "voice_not_found", "voice") from None

    def new_id(self) -> str:
        return "voice_" + uuid.uuid4().hex[:12]

    def temp_path(self, suffix: str) -> str:
        if not self.directory:
            raise ApiError(403, "voice uploads are disabled: start the server with --voices DIR",
                           "uploads_disabled")
        return os.path.join(self.directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}{suffix}")

    def reserve(self, voice_id: str) -> None:
        """Claim ``voice_id`` for a creation in progress; ApiError 409 if it exists or is claimed."""
        path = self.path_for(voice_id)
        with self._lock:
            if voice_id in self._reserved or os.path.lexists(path):
                raise ApiError(409, f"voice {voice_id!r} exists; delete it first or choose another name",
                               "voice_exists", "name")
            self._reserved.add(voice_id)

    def unreserve(self, voice_id: str) -> None:
        with self._lock:
            self._reserved.discard(voice_id)

    def publish(self, tmp: str, voice_id: str) -> None:
        """Move the finished file ``tmp`` to the voice's name; never replaces an existing voice."""
        path = self.path_for(voice_id)
        try:
            try:
                os.link(tmp, path)  # atomic, and fails if the name exists (also across processes)
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links: claim the name exclusively, then fill it
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
                os.replace(tmp, path)
        except FileExistsError:
            raise ApiError(409, f"voice {voice_id!r} exists; delete it first or choose another name",
                           "voice_exists", "name") from None
        finally:
            remove_quietly(tmp)

    def _sweep_stale(self) -> None:
        cutoff = time.time() - STALE_TEMP_S
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            with contextlib.suppress(OSError):
                if name.startswith(TEMP_PREFIX) and os.stat(path).st_mtime < cutoff:
                    os.unlink(path)
                    log.warning("removed a stale temporary upload %s", name)

    def delete(self, voice_id: str) -> None:
        """Remove the named entry: a voice file, or a symlink itself (never its target)."""
        path = self.path_for(voice_id)
        try:
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                raise ApiError(409, f"{voice_id!r} is not a voice file (a directory or another kind of entry); "
                               "remove it on the server", "not_a_voice", "voice_id")
            os.unlink(path)
        except FileNotFoundError:
            raise ApiError(404, f"unknown voice {voice_id!r}", "voice_not_found", "voice_id") from None
        except (IsADirectoryError, PermissionError) as exc:
            raise ApiError(409, f"{voice_id!r} cannot be deleted ({exc.strerror})", "not_a_voice",
                           "voice_id") from None
        self._cache.forget(path)


def remove_quietly(*paths: str) -> None:
    """Delete the files that exist among ``paths``."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
