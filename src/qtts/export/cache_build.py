"""The export step of a plan-cache build, run in a child process of the process that loads the plan.

``python -m qtts.export.cache_build SNAPSHOT OUT --options JSON --info JSON --info-path PATH``
exports ``SNAPSHOT`` into the new folder ``OUT`` with ``ExportOptions(**options)``, then writes
``info`` (plus the export versions and the build time) to ``PATH``. Not a user command (``qtts
cache build`` is): :func:`qtts.plans.build.run_child` starts it for :mod:`qtts.plans.cache`,
which keeps the key lock, the staging folder and the rename, and shows the progress. This side
speaks the line protocol of :mod:`qtts.plans.build` on the stdout it was given (anything else
it prints goes to stderr) and stops when its stdin closes (the parent is gone), so a build never
outlives the process waiting for it.

Test hook: ``QTTS_TEST_EXPORTER=MODULE`` makes the child call ``MODULE.export_bundle(model_dir,
out, opts, overwrite=False, progress=None)`` instead of :func:`qtts.export.onnx.export_bundle`
(tests/support/fake_exporter.py copies a bundle built once, so the cache's tests of the lock, a
killed build or a read-only cache run the real child without exporting again). Tests only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import threading
import time
import traceback

from ..errors import InputError, QttsError
from ..plans.build import EXIT_ORPHANED, emit
from ..plans.plan import write_json

ENV_TEST_EXPORTER = "QTTS_TEST_EXPORTER"


def export_preset(snapshot: str, out: str, options: dict, info: dict, info_path: str, progress=None) -> dict:
    """Export ``snapshot`` into ``out`` with :class:`~qtts.export.onnx.ExportOptions` ``options``
    (``progress(phase)`` as the exporter moves on), then write ``info`` (plus the export versions
    and timing) to ``info_path``; returns what it wrote."""
    from .onnx import ExportOptions, export_bundle

    hook = os.environ.get(ENV_TEST_EXPORTER)
    if hook:
        export_bundle = importlib.import_module(hook).export_bundle  # the test hook (module docstring)
    t0 = time.perf_counter()
    export_bundle(snapshot, out, ExportOptions(**options), progress=progress)
    info = {**info, "versions": _export_versions(), "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    write_json(info_path, info)
    return info


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    proto = _protocol_stream()
    _relay_logging(proto)
    _watch_parent()
    emit(proto, "start", pid=os.getpid())
    try:
        info = export_preset(args.snapshot, args.out, json.loads(args.options), json.loads(args.info),
                             args.info_path, progress=lambda name: emit(proto, "phase", name=name))  # fmt: skip
    except InputError as exc:
        emit(proto, "error", kind="input", message=str(exc))
        return 2
    except OSError as exc:
        emit(proto, "error", kind="os", message=str(exc), errno=exc.errno, strerror=exc.strerror,
             filename=exc.filename)  # fmt: skip
        return 1
    except Exception as exc:  # noqa: BLE001 - one line for the parent; the traceback goes to stderr (its debug log)
        traceback.print_exc()
        emit(proto, "error", kind="runtime", message=str(exc) if isinstance(exc, QttsError) else
             f"{type(exc).__name__}: {exc}")  # fmt: skip
        return 1
    emit(proto, "done", build_s=info["build_s"])
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot")
    p.add_argument("out")
    p.add_argument("--options", required=True, help="ExportOptions fields as a JSON object")
    p.add_argument("--info", required=True, help="the cache info to record, a JSON object")
    p.add_argument("--info-path", required=True, help="where to write it")
    return p


def _protocol_stream():
    """The stdout we were given, for the protocol only; fd 1 and sys.stdout become stderr, so
    nothing the exporter or a library prints can break a protocol line."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


class _Relay(logging.Handler):
    """Log records as protocol lines (qtts' from info up, the libraries' from warning up): the
    parent logs them again under its own settings."""

    def __init__(self, stream):
        super().__init__(logging.INFO)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING and not record.name.startswith("qtts"):
            return  # the libraries' info lines (a quantizer's per-node notes) stay here
        try:
            emit(self.stream, "log", logger=record.name, level=record.levelno, message=record.getMessage())
        except (OSError, ValueError, TypeError):
            self.handleError(record)


def _relay_logging(proto) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_Relay(proto)]
    root.setLevel(logging.INFO)


def _watch_parent() -> None:
    """Stop when stdin reaches its end: the parent closed it or ended (killed included)."""

    def watch():
        with contextlib.suppress(OSError):
            while os.read(0, 4096):  # the raw fd: a buffered reader's lock would block our own exit
                pass
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="qtts-build-parent", daemon=True).start()


def _export_versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("torch", "onnx", "onnx-ir"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


if __name__ == "__main__":
    sys.exit(main())
