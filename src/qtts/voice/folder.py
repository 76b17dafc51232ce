"""A directory of ``.voice`` files as servers use it: listed and read without following symlinks,
loaded voices cached by file identity.

Both servers (the HTTP voices directory, the Wyoming Base voice catalog) read voices that other
programs may replace, delete or turn into symlinks at any moment. So:

* only regular files count: a symlink (dangling or not, pointing in or out of the directory), a
  directory named ``x.voice``, a FIFO is neither listed nor read;
* a file is opened once with ``O_NOFOLLOW`` and everything (type, identity, bytes) comes from that
  open file, so a rename or delete between listing and reading gives "not found", never a crash
  or another file's contents;
* the cache key is (device, inode, size, mtime_ns, ctime_ns) of the open file: a file rewritten in
  place with its old mtime restored still has a new ctime, and a replaced file a new inode.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict

from ..errors import InputError
from .file import Voice

#: a voice file is a few KB (x-vector) to a few hundred KB (ICL reference codes); bigger is refused
MAX_VOICE_BYTES = 16 * 1024 * 1024


class VoiceFileMissing(InputError):
    """No regular voice file at the path (absent, a symlink, a directory, ...)."""


def regular_entries(directory: str, suffix: str) -> list[tuple[str, os.stat_result]]:
    """(stem, lstat) of the regular files ``*suffix`` directly in ``directory``, sorted; symlinks,
    directories and entries that vanish while listing are skipped."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.endswith(suffix):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        out.append((entry.name[: -len(suffix)], st))
    return sorted(out, key=lambda item: item[0])


def _key(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def open_regular(path: str) -> int:
    """An fd of the regular file at ``path`` (never through a symlink); VoiceFileMissing otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:  # ENOENT, ELOOP (a symlink), EACCES, ...
        raise VoiceFileMissing(f"no voice file {os.path.basename(path)!r}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise VoiceFileMissing(f"{os.path.basename(path)!r} is not a regular file")
    return fd


def _read_all(fd: int, size: int, name: str) -> bytes:
    if size > MAX_VOICE_BYTES:
        raise InputError(f"voice file {name!r} is {size} bytes; a voice is at most {MAX_VOICE_BYTES}")
    chunks, total = [], 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if total > MAX_VOICE_BYTES:
            raise InputError(f"voice file {name!r} is larger than {MAX_VOICE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def voice_from_bytes(data: bytes, name: str) -> Voice:
    """A validated :class:`qtts.Voice` from the bytes of a voice file (:meth:`Voice.from_bytes`)."""
    return Voice.from_bytes(data, name)


class VoiceFileCache:
    """Loaded voices by path, valid while the file's identity is unchanged; thread-safe. At most
    ``max_entries`` are kept (the least recently used go first): files removed or renamed on disk
    behind the server's back never grow it without bound."""

    def __init__(self, loader=None, max_entries: int = 256):
        self.loader = loader  # path -> Voice (tests); default: read the open file's bytes
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[tuple, object]] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, path: str):
        """The Voice at ``path``; VoiceFileMissing when there is no regular file there."""
        fd = open_regular(path)
        try:
            st = os.fstat(fd)
            key = _key(st)
            with self._lock:
                hit = self._cache.get(path)
                if hit is not None and hit[0] == key:
                    self._cache.move_to_end(path)
                    return hit[1]
            name = os.path.basename(path)
            try:
                if self.loader is not None:  # reads the path again: it may have changed since the open
                    voice = self.loader(path)
                else:
                    voice = voice_from_bytes(_read_all(fd, st.st_size, name), name)
            except OSError as exc:  # gone or replaced meanwhile
                raise VoiceFileMissing(f"voice file {name!r} changed while it was read; retry") from exc
        finally:
            os.close(fd)
        with self._lock:
            self._cache[path] = (key, voice)
            self._cache.move_to_end(path)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return voice

    def forget(self, path: str) -> None:
        with self._lock:
            self._cache.pop(path, None)
