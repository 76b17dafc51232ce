"""Optional compiled kernels: C sources in this folder, built by the system compiler on first use.

Today one onnxruntime custom op, ``qtts.kernels::SnakeBeta`` (``snake.c``: the vocoder's
activation in one vectorised, multi-threaded pass instead of five, with onnxruntime's scalar
``Sin`` among them). Nothing needs it: the bundle's vocoder steps call SnakeBeta as a model-local
ONNX function (:mod:`qtts.export.snake`) that onnxruntime inlines to the plain ops wherever the
library is not registered. So:

* :func:`library` builds it once (:mod:`qtts.kernels.build`: cc/gcc/clang, a self-test in a child
  process, an atomic rename into ``$QTTS_CACHE/kernels``) and returns its path, or None with one
  warning per cache when there is no compiler or the build fails;
* :func:`register` adds it to an onnxruntime ``SessionOptions`` (the vocoder sessions);
* ``QTTS_KERNELS=0`` turns it off (the plain graph runs, bit for bit as before); ``qtts kernels
  build`` builds or rebuilds it and says which code path (AVX-512, AVX2, NEON, plain C) this CPU gets.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

ENV = "QTTS_KERNELS"
DOMAIN = "qtts.kernels"
_lock = threading.Lock()
_built: dict = {}  # build key folder -> Build: one build (or one warning) per process


def enabled() -> bool:
    """False when ``QTTS_KERNELS`` is 0 / off / no / false."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "no", "false")


def library() -> str | None:
    """The compiled library's path (built now if this source/compiler has none yet), or None:
    off, no compiler, or a failed build (logged once per process; a fresh failure is a warning)."""
    if not enabled():
        return None
    from .build import build, build_key, compiler, kernels_root

    key = os.path.join(kernels_root(), build_key(compiler()))
    with _lock:
        if key not in _built:
            result = build()
            _built[key] = result
            if result.path is None:
                fresh = "recorded" not in result.reason
                (log.warning if fresh else log.info)(
                    "qtts kernels unavailable, the plain vocoder graph runs instead: %s", result.reason)
        return _built[key].path


def register(options) -> bool:
    """Register the library with an onnxruntime ``SessionOptions``; False (and nothing changed)
    when there is none or onnxruntime refuses it."""
    path = library()
    if path is None:
        return False
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    try:
        options.register_custom_ops_library(path)
    except (ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.RuntimeException, OSError) as exc:
        log.warning("onnxruntime refused the qtts kernels (%s), the plain graph runs instead", exc)
        return False
    return True


def isa(path: str) -> str:
    """The code path the library picked on this CPU: avx512 | avx2 (x86-64), neon (arm64) | generic."""
    import ctypes

    fn = ctypes.CDLL(path).qtts_kernels_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()
