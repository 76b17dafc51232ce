"""Optional compiled kernels: C sources in this folder, built by the system compiler on first use.

An onnxruntime custom op, ``qtts.kernels::SnakeBeta`` (``snake.c``: the vocoder's activation in
one vectorised, multi-threaded pass instead of five, with onnxruntime's scalar ``Sin`` among them),
and :func:`snake_rows` (``snake_rows.c``, through ctypes: the same activation on rows, rounded to
bf16, for the torch runtime's bf16 vocoder step). A second op, ``qtts.kernels::DecoderLayer``
(``layer*.c``, :mod:`qtts.kernels.layer`), is one whole int8 decoder layer of the code predictor in
one call, on the library's own threads (:func:`set_layer_threads`), instead of ~27 onnxruntime
nodes with a thread-pool hand-off at each GEMV. Nothing needs it: the bundle's vocoder steps call
SnakeBeta as a model-local ONNX function (:mod:`qtts.export.snake`; a predictor graph calls
DecoderLayer the same way) that onnxruntime inlines to the plain ops wherever the library is not
registered. So:

* :func:`library` returns the library built for this source tree and compiler, found in
  ``$QTTS_CACHE/kernels/<key>/`` (default ``~/.cache/qtts``; :func:`build_key`: sources, flags,
  compiler, platform), or builds it there once (:func:`build`), or returns None with one warning
  per cache when there is no compiler or the build fails;
* :func:`register` adds it to an onnxruntime ``SessionOptions`` (the vocoder sessions);
* ``QTTS_KERNELS=0`` turns it off (the plain graph runs, bit for bit as before); ``qtts kernels
  build`` builds or rebuilds it and says which code path (AVX-512, AVX2, NEON, plain C) this CPU gets.

A build compiles with cc/gcc/clang (or ``$CC``) to a temporary name, runs :mod:`qtts.kernels.selftest`
on it in a child process (an ABI slot that does not match this onnxruntime crashes the child, never the
caller), and only then renames it into place, so a library that exists has passed. A failed build
leaves ``failed.txt`` with the reason beside it: later processes skip it until ``qtts kernels build``
(:func:`build` with ``force``) retries, or the sources or the compiler change the key.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..errors import InputError
from ..files import atomic_path, publish, temp_beside

log = logging.getLogger(__name__)

ENV = "QTTS_KERNELS"
DOMAIN = "qtts.kernels"
_lock = threading.Lock()
_built: dict = {}  # build key folder -> the library path (or None: one warning) per process
_rows: dict = {}  # "fn": the ctypes qtts_snake_rows (or None), looked up once


def enabled() -> bool:
    """False when ``QTTS_KERNELS`` is 0 / off / no / false."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "no", "false")


def library() -> str | None:
    """The compiled library's path (built now if this source/compiler has none yet), or None:
    off, no compiler, or a failed build (logged once per process; a fresh failure is a warning).
    A library already in the cache is only looked up: nothing is compiled or tested again."""
    if not enabled():
        return None
    cc = compiler()
    folder = os.path.join(kernels_root(), build_key(cc))
    with _lock:
        if folder not in _built:
            target = os.path.join(folder, library_name())
            result = Build(target) if os.path.isfile(target) else _build_missing(cc, folder, target)
            _built[folder] = result.path
            if result.path is None:
                fresh = "recorded" not in result.reason
                (log.warning if fresh else log.info)(
                    "qtts kernels unavailable, the plain vocoder graph runs instead: %s", result.reason)
        return _built[folder]


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


def _rows_fn():
    """qtts_snake_rows from the library (None without one), looked up once."""
    if "fn" not in _rows:
        path = library()  # takes _lock itself
        fn = None
        if path is not None:
            fn = ctypes.CDLL(path).qtts_snake_rows
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p]  # fmt: skip
        _rows["fn"] = fn  # two threads racing here set the same value
    return _rows["fn"]


def rows_available() -> bool:
    return _rows_fn() is not None


def snake_rows(x, a, inv_b, isa: str | None = None, out=None):
    """``snake_rows.c``: bf16 ``x + inv_b * sin(a * x)^2`` of contiguous rows ``x`` [T, C]
    (float32 or bf16) with ``a``, ``inv_b`` float32 [C], in one pass (torch ops take six): the input of each convolution of
    :class:`qtts.model.vocoder_step_bf16.VocoderStepBF16`. None when the library is unavailable: the
    step then runs the torch ops (equal within one bf16 rounding step: torch's ``sin`` is not the
    library's polynomial). ``isa``: "avx512" or "generic" to force a path (tests); ValueError when
    this CPU lacks it. ``out``: contiguous bf16 [T, C] to write into (returned), else a new one."""
    import torch

    fn = _rows_fn()
    if fn is None:
        return None
    if x.dim() != 2 or not x.is_contiguous() or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"snake_rows takes contiguous float32/bf16 rows [T, C], got {x.dtype} {tuple(x.shape)}")
    rows, channels = x.shape
    if a.numel() != channels or inv_b.numel() != channels or a.dtype != torch.float32 or inv_b.dtype != torch.float32:
        raise ValueError(f"snake_rows: a and inv_b must be {channels} float32 values")
    if out is None:
        out = torch.empty((rows, channels), dtype=torch.bfloat16)
    elif out.shape != x.shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"snake_rows: out must be contiguous bf16 {tuple(x.shape)}")
    a, inv_b = a.contiguous(), inv_b.contiguous()  # held until the call returns
    code = fn(x.data_ptr(), int(x.dtype == torch.bfloat16), a.data_ptr(), inv_b.data_ptr(),
              out.data_ptr(), rows, channels, isa.encode() if isa else None)  # fmt: skip
    if code != 0:
        raise ValueError(f"snake_rows: the '{isa}' path is not available on this CPU")
    return out


def set_layer_threads(n: int) -> int | None:
    """Threads of the ``DecoderLayer`` op in this process, the calling thread included (default 2,
    1 on a one-CPU machine; 1: no worker threads, e.g. when other work fills the other cores).
    Workers are started on first use, spin between the GEMVs of a layer (``QTTS_LAYER_SPIN_US``,
    default 50 us; 0: block at once), then sleep. Returns the count in force, or None without a
    library. Results never depend on either."""
    path = library()
    if path is None:
        return None
    from .layer import set_spin_us, set_threads

    spin = os.environ.get(LAYER_SPIN_ENV, "").strip() or str(LAYER_SPIN_DEFAULT_US)
    if not spin.isdigit():
        raise InputError(f"{LAYER_SPIN_ENV}={spin!r} is not a whole number of microseconds; set it to 0 "
                         f"(no spinning) or a bound such as {LAYER_SPIN_DEFAULT_US}, or unset it")  # fmt: skip
    set_spin_us(path, min(int(spin), 1000000))
    return set_threads(path, n)


def isa(path: str) -> str:
    """The code path the library picked on this CPU: avx512 | avx2 (x86-64), neon (arm64) | generic."""
    fn = ctypes.CDLL(path).qtts_kernels_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()


HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("snake.c", "snake_rows.c", "layer.c", "layer_dot.c", "layer_pool.c", "layer_op.c")
HEADERS = ("ort_abi.h", "sin2.h", "layer.h")
#: -O3 vectorises the plain-C path for the baseline ISA; the AVX2 / AVX-512 paths carry their own
#: target attributes and are picked at run time, so the library runs on any CPU of the architecture;
#: -pthread: the DecoderLayer's worker threads
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fno-math-errno", "-Wall", "-pthread")
#: after the sources: libm, and libdl for dladdr / dlopen (DecoderLayer's workers pin the library)
LIBS = ("-lm", "-ldl")
COMPILERS = ("cc", "gcc", "clang")
LAYER_SPIN_ENV, LAYER_SPIN_DEFAULT_US = "QTTS_LAYER_SPIN_US", 50  # the default is layer_pool.c's
FAILED = "failed.txt"
TIMEOUT_S = 300
APT_HINT = "install a C compiler (Debian/Ubuntu: apt-get install gcc) or set CC"


@dataclass(frozen=True)
class Build:
    #: the library, or None when there is none
    path: str | None
    #: why there is none (empty when there is one)
    reason: str = ""
    #: compiled by this call (not found in the cache)
    fresh: bool = False
    #: the self-test's line ("ok avx512 151.2 dB") when this call compiled it
    selftest: str = ""


def library_name() -> str:
    return "libqtts_kernels.dylib" if sys.platform == "darwin" else "libqtts_kernels.so"


def kernels_root() -> str:
    """``$QTTS_CACHE/kernels`` (the plan cache's folder, :func:`qtts.plans.cache.cache_root`)."""
    root = os.environ.get("QTTS_CACHE") or os.path.join("~", ".cache", "qtts")
    return os.path.join(os.path.abspath(os.path.expanduser(root)), "kernels")


def compiler() -> list[str] | None:
    """``$CC`` (split like a shell would), else the first of cc, gcc, clang on PATH; None if none."""
    if os.environ.get("CC", "").strip():
        cc = shlex.split(os.environ["CC"])
        return cc if shutil.which(cc[0]) else None
    found = next((shutil.which(c) for c in COMPILERS if shutil.which(c)), None)
    return [found] if found else None


def build_key(cc: list[str] | None) -> str:
    """Sources, headers, flags, the compiler binary (path, size, mtime) and the platform, hashed."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        with open(os.path.join(HERE, name), "rb") as fh:
            h.update(name.encode() + b"\0" + fh.read())
    if cc:
        real = os.path.realpath(shutil.which(cc[0]) or cc[0])
        st = os.stat(real)
        h.update(repr((cc, real, st.st_size, st.st_mtime_ns)).encode())
    h.update(repr((FLAGS, LIBS, sys.platform, platform.machine())).encode())
    return h.hexdigest()[:16] if cc else "no-compiler"


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def _compile(cc: list[str], out: str) -> str:
    """Compile into ``out``; '' on success, else the compiler's complaint."""
    cmd = [*cc, *FLAGS, "-I", HERE, *(os.path.join(HERE, s) for s in SOURCES), "-o", out, *LIBS]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{cc[0]} did not run: {exc}"
    return "" if proc.returncode == 0 else f"{cc[0]} exited {proc.returncode}: {_tail(proc.stderr)}"


def _selftest(path: str) -> tuple[str, str]:
    """(the self-test's 'ok ...' line, '') or ('', why it failed)."""
    cmd = [sys.executable, os.path.join(HERE, "selftest.py"), path]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"the self-test did not finish: {exc}"
    if proc.returncode == 0 and proc.stdout.startswith("ok "):
        return proc.stdout.strip(), ""
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return "", f"the self-test failed ({how}): {_tail(proc.stderr) or _tail(proc.stdout)}"


def _record_failure(folder: str, reason: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        with atomic_path(os.path.join(folder, FAILED)) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(reason + "\n")
    except OSError as exc:  # a read-only cache: the next process tries again
        log.debug("could not record the failed kernel build in %s: %s", folder, exc)


def build(force: bool = False) -> Build:
    """The library for this source tree and compiler: cached, or compiled + self-tested now."""
    cc = compiler()
    folder = os.path.join(kernels_root(), build_key(cc))
    target = os.path.join(folder, library_name())
    if not force and os.path.isfile(target):
        return Build(target)
    return _build_missing(cc, folder, target, force)


def _build_missing(cc: list[str] | None, folder: str, target: str, force: bool = False) -> Build:
    """No library at ``target``: the recorded failure (unless ``force``), or a build now."""
    failed = os.path.join(folder, FAILED)
    if not force and os.path.isfile(failed):
        with open(failed, encoding="utf-8") as fh:
            return Build(None, fh.read().strip() + " (recorded; `qtts kernels build` retries)")
    if cc is None:
        reason = f"no C compiler: {APT_HINT}"
        _record_failure(folder, reason)
        return Build(None, reason)
    return _build_into(cc, folder, target)


def _build_into(cc: list[str], folder: str, target: str) -> Build:
    start = time.monotonic()
    log.info("compiling the qtts kernels with %s into %s (once per compiler and source version)", cc[0], folder)
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = temp_beside(target, ".so.part")
    except OSError as exc:
        return Build(None, f"cannot write {folder}: {exc}; set QTTS_CACHE to a writable folder")
    try:
        reason = _compile(cc, tmp)
        line = ""
        if not reason:
            line, reason = _selftest(tmp)
        if reason:
            _record_failure(folder, reason)
            return Build(None, reason)
        publish(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if os.path.exists(os.path.join(folder, FAILED)):
        os.unlink(os.path.join(folder, FAILED))
    log.info("built %s in %.1f s (self-test: %s)", target, time.monotonic() - start, line)
    return Build(target, fresh=True, selftest=line)
