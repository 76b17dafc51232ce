"""A stand-in exporter for the plan-cache build child, named by its test hook
``QTTS_TEST_EXPORTER=support.fake_exporter`` (qtts/export/cache_build.py).

The real child process runs and speaks its protocol; only the export step is this copy of a bundle
built once by the real exporter. Set by the test, read in the child:

* ``FAKE_SOURCE``  the bundle folder to copy;
* ``FAKE_COUNT``   a file that gets one JSON line per export: the child's pid and the ExportOptions;
* ``FAKE_DELAY``   seconds to wait, after writing a partial file, before the copy (default 0);
* ``FAKE_FAIL``    when set, raise a QttsError with this message instead of exporting.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time

from qtts.errors import QttsError

log = logging.getLogger(__name__)


def export_bundle(model_dir, out, opts, overwrite=False, progress=None):
    with open(os.environ["FAKE_COUNT"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "opts": dataclasses.asdict(opts)}) + "\n")
    log.warning("fake exporter: copying a bundle for %s", model_dir)
    for phase in ("checkpoint", "talker"):
        if progress is not None:
            progress(phase)
    if os.environ.get("FAKE_FAIL"):
        raise QttsError(os.environ["FAKE_FAIL"])
    os.makedirs(out)
    open(os.path.join(out, "partial.onnx"), "w").close()
    deadline = time.monotonic() + float(os.environ.get("FAKE_DELAY", "0"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(out)
    shutil.copytree(os.environ["FAKE_SOURCE"], out)  # its cache.json is replaced by the child's
    return {}


def builds(count_file) -> list[dict]:
    """The exports recorded in ``count_file`` (none when it does not exist)."""
    if not os.path.exists(count_file):
        return []
    with open(count_file, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
