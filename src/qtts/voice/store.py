"""A folder of voice files that a server writes: ``<folder>/<id>.voice``, created and deleted safely.

Ids are 1-64 characters of ``A-Z a-z 0-9 _ -`` (whole-string match: no trailing newline) and the
path sits directly inside the folder, so no id can name a file elsewhere. Only regular files are
voices: symlinks are never followed, listed or read, and :meth:`VoiceStore.delete` removes the
named entry only (a symlink itself, never its target). Listing and loading survive files that
vanish or change meanwhile (:mod:`qtts.voice.folder`).

Writes never leave a half-written voice: a voice is written to a hidden temporary name in the folder
and *published* with ``os.link``, which fails if the name exists, so a voice is never replaced and
of two writers racing for one name (threads or processes) exactly one wins. A name being created is
*reserved* (under a lock) from before its upload is read until it is published. Temporary files a
crash left behind are removed when a store opens, once they are an hour old.

Errors are :class:`StoreError` (an :class:`~qtts.errors.InputError`) with a ``code`` and the
``field`` of the request that named the voice; servers map them to their own answers
(:mod:`qtts.server.voices`).
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

from ..errors import InputError
from .folder import VoiceFileCache, VoiceFileMissing, regular_entries

log = logging.getLogger(__name__)

#: use with ``fullmatch`` (``$`` would also match before a final newline)
VOICE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
SUFFIX = ".voice"
TEMP_PREFIX = ".upload-"
#: temporary files older than this are removed when a store opens (left by a crash); besides the
#: store's own (``.upload-*``), the atomic writes of :mod:`qtts.files` (``.qtts-*.part``)
STALE_TEMP_S = 3600.0


class StoreError(InputError):
    """A voice store refusal; ``code`` names the kind, ``field`` the request field it is about."""

    code = "invalid_voice"

    def __init__(self, message: str, field: str | None = "voice"):
        super().__init__(message)
        self.field = field


class InvalidVoiceId(StoreError):
    code = "invalid_voice_id"


class UnknownVoice(StoreError):
    code = "voice_not_found"


class VoiceExists(StoreError):
    code = "voice_exists"


class NotAVoice(StoreError):
    """The name is taken by a directory or another kind of entry."""

    code = "not_a_voice"


class StoreDisabled(StoreError):
    """The store has no folder: nothing can be written."""

    code = "uploads_disabled"


def is_voice_id(value) -> bool:
    return isinstance(value, str) and VOICE_ID_RE.fullmatch(value) is not None


def check_voice_id(voice_id: str, field: str = "voice") -> str:
    """``voice_id`` when it is a valid id; InvalidVoiceId otherwise."""
    if not is_voice_id(voice_id):
        raise InvalidVoiceId(f"invalid {field} id {voice_id!r}: ids are 1-64 characters of A-Z a-z 0-9 _ -", field)
    return voice_id


def _exists_error(voice_id: str) -> VoiceExists:
    return VoiceExists(f"voice {voice_id!r} exists; delete it first or choose another name", "name")


class VoiceStore:
    """Voice files in one folder (None: a store with no voices that refuses writes); thread-safe
    cache of loaded voices."""

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
        """The file of ``voice_id`` (validated; never outside the folder)."""
        check_voice_id(voice_id)
        if not self.directory:
            raise UnknownVoice(f"unknown voice {voice_id!r}: voice uploads are disabled on this server")
        path = os.path.join(self.directory, voice_id + SUFFIX)  # not resolved: a symlink is not followed
        if os.path.dirname(path) != self.directory:
            raise InvalidVoiceId(f"invalid voice id {voice_id!r}")
        return path

    def exists(self, voice_id: str) -> bool:
        """True when ``voice_id`` is a regular file (not a symlink) in the folder."""
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
        """The :class:`qtts.Voice` of ``voice_id`` (cached); UnknownVoice when missing."""
        path = self.path_for(voice_id)
        try:
            return self._cache.load(path)
        except VoiceFileMissing:
            raise UnknownVoice(f"unknown voice {voice_id!r}") from None

    def new_id(self) -> str:
        return "voice_" + uuid.uuid4().hex[:12]

    def temp_path(self, suffix: str) -> str:
        """A fresh hidden name in the folder for a file being written (swept after a crash)."""
        if not self.directory:
            raise StoreDisabled("voice uploads are disabled: start the server with --voices DIR", None)
        return os.path.join(self.directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}{suffix}")

    def reserve(self, voice_id: str) -> None:
        """Claim ``voice_id`` for a creation in progress; VoiceExists if it exists or is claimed."""
        path = self.path_for(voice_id)
        with self._lock:
            if voice_id in self._reserved or os.path.lexists(path):
                raise _exists_error(voice_id)
            self._reserved.add(voice_id)

    def unreserve(self, voice_id: str) -> None:
        with self._lock:
            self._reserved.discard(voice_id)

    def publish(self, tmp: str, voice_id: str) -> None:
        """Move the finished file ``tmp`` to the voice's name; never replaces an existing voice
        (VoiceExists). ``tmp`` is gone afterwards, whatever happens."""
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
            raise _exists_error(voice_id) from None
        finally:
            remove_quietly(tmp)

    def add(self, voice, voice_id: str) -> None:
        """Write ``voice`` (a :class:`qtts.Voice`) under ``voice_id``: saved to a temporary name,
        then published (VoiceExists if the name is taken meanwhile); nothing is left on failure."""
        tmp = self.temp_path(".voice.part")
        try:
            voice.save(tmp)
            self.publish(tmp, voice_id)
        finally:
            remove_quietly(tmp)

    def _sweep_stale(self) -> None:
        cutoff = time.time() - STALE_TEMP_S
        for name in os.listdir(self.directory):
            if not (name.startswith(TEMP_PREFIX) or (name.startswith(".qtts-") and name.endswith(".part"))):
                continue
            path = os.path.join(self.directory, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_mtime < cutoff:
                    os.unlink(path)
                    log.warning("removed a stale temporary upload %s", name)

    def delete(self, voice_id: str) -> None:
        """Remove the named entry: a voice file, or a symlink itself (never its target)."""
        path = self.path_for(voice_id)
        try:
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                raise NotAVoice(f"{voice_id!r} is not a voice file (a directory or another kind of entry); "
                                "remove it on the server", "voice_id")
            os.unlink(path)
        except FileNotFoundError:
            raise UnknownVoice(f"unknown voice {voice_id!r}", "voice_id") from None
        except (IsADirectoryError, PermissionError) as exc:
            raise NotAVoice(f"{voice_id!r} cannot be deleted ({exc.strerror})", "voice_id") from None
        self._cache.forget(path)


def remove_quietly(*paths: str) -> None:
    """Delete the files that exist among ``paths``."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
