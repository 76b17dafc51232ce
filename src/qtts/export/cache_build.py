"""The export step of a plan-cache build: one preset's bundle with progress, and its cache info.

Called by :mod:`qtts.backends.cache_store` (which owns the key lock, the staging folder and the
rename) with every input explicit: the export options of the preset, the info to record and where.
It imports nothing of the cache, so runtime and exporter form no import circle.
"""

from __future__ import annotations

import contextlib
import os
import time

from ..backends.bundle import write_json


def export_preset(snapshot: str, out: str, options: dict, info: dict, info_path: str, what: str,
                  listeners: tuple = ()) -> str:  # fmt: skip
    """Export ``snapshot`` into ``out`` with :class:`~qtts.export.onnx.ExportOptions` ``options``
    (progress shown as ``what``), then write ``info`` (plus the export versions and timing) to
    ``info_path``; returns ``out``."""
    from .onnx import ExportOptions, export_bundle
    from .progress import BuildProgress, expected_seconds

    progress = BuildProgress(what, expected_seconds(_weights_bytes(snapshot)), listeners)
    t0 = time.perf_counter()
    ok = False
    try:
        export_bundle(snapshot, out, ExportOptions(**options), progress=progress.phase)
        ok = True
    finally:
        progress.finish(ok)
    info = {**info, "versions": _export_versions(), "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    write_json(info_path, info)
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
