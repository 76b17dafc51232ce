"""2 MB pages for the weights onnxruntime holds in memory (Linux; best effort, never an error).

onnxruntime prepacks every MatMulNBits weight (the talker's and predictor's 8- or 4-bit
projections) into anonymous memory of its own. Where the kernel's transparent huge pages are
``madvise``-only (a common default) that memory sits on 4 KB pages, because onnxruntime never asks
for more, and a GEMV that streams ~0.5 GB of weights per step pays a TLB miss every 4 KB and a
hardware prefetcher that stops at every page edge. :func:`advise` asks for 2 MB pages
(``MADV_HUGEPAGE``) and collapses the pages already there (``MADV_COLLAPSE``, Linux >= 6.1) over
the process's large anonymous mappings that are almost fully resident (so a sparse mapping, such as
a thread stack, never grows). Measured on a 2-core Zen 4 VM: talker and predictor about a third less CPU per
frame, the whole frame -21 %, the same RSS (docs/performance.md, "2 MB pages for the weights").
``QTTS_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time

log = logging.getLogger(__name__)

ENV = "QTTS_HUGE_PAGES"
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
#: mappings smaller than this are not worth a huge page (numpy advises its own large arrays)
MIN_BYTES = 4 << 20
#: only mappings at least this resident are collapsed (collapsing fills the holes of a mapping)
MIN_RESIDENT = 0.9
_lock = threading.Lock()


def enabled() -> bool:
    """False off Linux, when ``QTTS_HUGE_PAGES`` is 0 / off / no / false, or when the kernel's
    transparent huge pages are ``never``."""
    if not sys.platform.startswith("linux"):
        return False
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    return thp_mode() in ("always", "madvise")


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode (always / madvise / never), None where unknown."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def candidates(min_bytes: int = MIN_BYTES, min_resident: float = MIN_RESIDENT) -> list[tuple[int, int]]:
    """(start, length) of this process's anonymous read-write mappings (and the heap) of at least
    ``min_bytes`` whose resident share is at least ``min_resident`` (from /proc/self/smaps)."""
    out, current = [], None
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                anon = len(head) == 5 or head[5] == "[heap]"
                current = (lo, hi - lo) if anon and head[1].startswith("rw") and hi - lo >= min_bytes else None
            elif current and head[0] == "Rss:":
                if int(head[1]) * 1024 >= min_resident * current[1]:
                    out.append(current)
                current = None
    return out


def advise(min_bytes: int = MIN_BYTES) -> int:
    """Ask for 2 MB pages over :func:`candidates` and collapse them now; the bytes advised (0 when
    :func:`enabled` is False or the kernel refuses). Call it once the sessions are built."""
    if not enabled():
        return 0
    with _lock:
        t0, done = time.perf_counter(), 0
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            for start, length in candidates(min_bytes):
                if libc.madvise(start, length, MADV_HUGEPAGE) == 0:
                    libc.madvise(start, length, MADV_COLLAPSE)  # older kernels: EINVAL, khugepaged does it later
                    done += length
        except (OSError, AttributeError, ValueError) as exc:  # no libc madvise, no /proc: nothing to do
            log.debug("huge pages not advised: %s", exc)
            return 0
        log.debug("huge pages: %.0f MB advised in %.2f s", done / 2**20, time.perf_counter() - t0)
        return done
