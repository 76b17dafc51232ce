"""Building a cached bundle once (called by :func:`qtts.backends.cache.bundle_plan` when one is missing): a file lock per key, a staging folder renamed when complete.

Two processes that need the same bundle take the key's lock (``locks/<key>.lock``, ``flock``) in
turn: the first builds, the second finds the finished bundle when the lock is released (the lock
goes with its process, so a killed builder never blocks the next one). The bundle is exported into
``bundles/.<key>.<random>.part`` and renamed to ``bundles/<key>`` only when complete (plan,
manifest and :data:`~qtts.backends.cache.INFO` written), so a killed build leaves a ``.part``
folder that no lookup matches; the next build of that key removes it. A cache folder that cannot be
written gives one warning and a build into a temporary folder removed at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import filecmp
import logging
import os
import secrets
import shutil
import tempfile
import time

from ..backends import cache
from ..backends.cache import export_missing
from ..errors import InputError, QttsError

log = logging.getLogger(__name__)

def build(snapshot: str, preset: str, listeners: tuple = ()) -> str:
    """Build ``preset``'s bundle for ``snapshot`` into the cache (or a temp folder); its plan.json."""
    missing = export_missing()
    if missing:
        raise InputError(
            f"no cached '{preset}' plan for {snapshot}, and building one needs {missing}: install the export "
            f"extra ({cache.INSTALL_EXPORT}), or pass --plan PATH/plan.json of an exported bundle"
            + ("" if missing == "torch" else ", or --plan torch")
        )
    from ..backends.bundle import fingerprint

    key = cache.cache_key(fingerprint(snapshot), preset)
    root = cache.bundles_dir()
    try:
        lock = _prepare(root, key)
    except OSError as exc:
        log.warning("qtts: the plan cache %s is not writable (%s): building the '%s' plan into a temporary "
                    "folder for this run only (set %s to a writable folder to keep it)",
                    cache.cache_root(), exc.strerror or exc, preset, cache.ENV_CACHE)
        return _build_temporary(snapshot, preset, key, listeners)
    with lock:
        final = os.path.join(root, key)
        if os.path.isfile(os.path.join(final, "plan.json")):  # another process built it while we waited
            log.info("qtts: plan '%s' built by another process: %s", preset, final)
            return os.path.join(final, "plan.json")
        _remove_stale(root, key)
        staging = os.path.join(root, f".{key}.{secrets.token_hex(4)}.part")
        os.mkdir(staging)
        try:
            bundle = _export(snapshot, preset, os.path.join(staging, "bundle"), listeners)
            _link_shared(root, key, bundle)
            if os.path.isdir(final):  # an incomplete folder of that name (no plan.json): replace it
                shutil.rmtree(final)
            os.replace(bundle, final)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            return _full(preset, exc)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return os.path.join(final, "plan.json")


def _full(preset: str, exc: OSError):
    """The cache filled up during the build: torch, with one warning (or an error without torch)."""
    if export_missing() == "torch":
        raise QttsError(f"no space left in the plan cache {cache.cache_root()} to build the '{preset}' plan "
                        f"({exc.strerror}); free some space or set {cache.ENV_CACHE} to another folder")
    log.warning("qtts: no space left in the plan cache %s to build the '%s' plan (%s): running the torch fp32 "
                "reference instead (free some space or set %s to another folder)", cache.cache_root(), preset,
                exc.strerror, cache.ENV_CACHE)
    return cache.Plan()


def _prepare(root: str, key: str):
    """Create the cache folders and open the key's lock (raises OSError when it cannot)."""
    os.makedirs(root, exist_ok=True)
    locks = os.path.join(os.path.dirname(root), "locks")
    os.makedirs(locks, exist_ok=True)
    if not os.access(root, os.W_OK):
        raise PermissionError(13, "Permission denied", root)
    return _Lock(os.path.join(locks, key + ".lock"))


class _Lock:
    """An exclusive ``flock`` on a file; where flock does not exist (Windows), no lock."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def __enter__(self):
        try:
            import fcntl
        except ImportError:
            return self
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("qtts: another process is building this plan (%s); waiting for it", self.path)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the flock
        return False


def _remove_stale(root: str, key: str) -> None:
    """Staging folders of this key left by a killed build (we hold the key's lock: none is live)."""
    for name in os.listdir(root):
        if name.startswith(f".{key}.") and name.endswith(".part"):
            log.info("qtts: removing an unfinished build: %s", name)
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _link_shared(root: str, key: str, bundle: str) -> None:
    """Files identical to a file of the same name in another preset's bundle of this checkpoint (the
    vocoder, the encoders, fp16 tables) become hard links to it: one copy on disk, and removing
    either bundle leaves the other whole."""
    fp = key.split("-")[0]
    siblings = [os.path.join(root, n) for n in os.listdir(root) if n.startswith(fp + "-") and n != key]
    for dirpath, _, files in os.walk(bundle):
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, bundle)
            for other in (os.path.join(s, rel) for s in siblings):
                if os.path.isfile(other) and os.path.getsize(other) == os.path.getsize(path) and \
                        filecmp.cmp(other, path, shallow=False):
                    with contextlib.suppress(OSError):  # no hard links here (another filesystem): keep the copy
                        tmp = path + ".link"
                        os.link(other, tmp)
                        os.replace(tmp, path)
                    break


def _build_temporary(snapshot: str, preset: str, key: str, listeners: tuple) -> str:
    tmp = tempfile.mkdtemp(prefix="qtts-plan-")
    atexit.register(shutil.rmtree, tmp, True)
    try:
        return os.path.join(_export(snapshot, preset, os.path.join(tmp, key), listeners), "plan.json")
    except OSError as exc:
        raise QttsError(f"cannot build the '{preset}' plan in a temporary folder either ({exc}); free some disk "
                        "space, set QTTS_CACHE to a writable folder, or pass --plan torch") from exc


def _export(snapshot: str, preset: str, out: str, listeners: tuple) -> str:
    """Export ``preset`` into ``out`` with progress, then write its cache info; returns ``out``."""
    from .. import __version__
    from ..backends.bundle import fingerprint, write_json
    from .onnx import ExportOptions, export_bundle
    from .progress import BuildProgress, expected_seconds

    p = cache.PRESETS[preset]
    opts = ExportOptions(talker=p.talker, predictor=p.predictor, block_size=p.block_size, tables=p.tables)
    progress = BuildProgress(f"the '{preset}' plan", expected_seconds(_weights_bytes(snapshot)), listeners)
    t0 = time.perf_counter()
    ok = False
    try:
        export_bundle(snapshot, out, opts, progress=progress.phase)
        ok = True
    finally:
        progress.finish(ok)
    info = {"preset": preset, "model": snapshot, "fingerprint": fingerprint(snapshot), "qtts_version": __version__,
            "format": cache.FORMAT, "onnxruntime": cache.runtime_version(), "versions": _export_versions(),
            "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    write_json(os.path.join(out, cache.INFO), info)
    return out


def _export_versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("torch", "onnx", "onnx-ir"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def _weights_bytes(snapshot: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(snapshot) for f in fs
               if f.endswith(".safetensors"))  # fmt: skip
