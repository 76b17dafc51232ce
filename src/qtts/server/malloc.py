"""glibc malloc settings for a long-running server process.

glibc gives every thread that allocates its own malloc arena, up to 8 per core. A server's
threads (the workers, the engine's batch and vocoder threads, onnxruntime's pools, the asyncio
default executor) each fill an arena with short-lived buffers, and memory freed into one arena
is kept there: under a churn of connections and requests the process grows by hundreds of MB
that it never uses again (docs/operations.md, "Soak result"). :func:`limit_arenas` caps the arenas
at ``ARENAS`` before the threads start. The ``MALLOC_ARENA_MAX`` environment variable, read by
glibc itself, wins when it is set; other C libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

#: glibc's mallopt parameter number for the arena cap (malloc.h)
M_ARENA_MAX = -8
#: arenas a server process keeps (the main one and one for every other thread to share)
ARENAS = 2


def _glibc():
    """The C library when it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError):  # not glibc (musl has no gnu_get_libc_version)
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> int | None:
    """Cap glibc's malloc arenas at ``arenas`` for this process; call it before starting threads.
    Returns the cap in force, or None when nothing was set (not glibc, or ``MALLOC_ARENA_MAX`` in
    the environment, which glibc has applied itself)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        log.debug("malloc arenas: MALLOC_ARENA_MAX=%s from the environment", os.environ["MALLOC_ARENA_MAX"])
        return None
    libc = _glibc()
    if libc is None or not libc.mallopt(M_ARENA_MAX, int(arenas)):
        return None
    log.debug("malloc arenas capped at %d", arenas)
    return int(arenas)
