"""The tree has no leftover merge-conflict markers (a merge can leave them in docs, where no test reads)."""

from __future__ import annotations

import os
import subprocess

from conftest import REPO_ROOT


def test_no_conflict_markers():
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    bad = []
    for name in files:
        path = os.path.join(REPO_ROOT, name)
        if not os.path.isfile(path) or name.endswith((".png", ".npy", ".wav", ".onnx")):
            continue
        with open(path, "rb") as fh:
            for i, line in enumerate(fh, 1):
                if line.startswith((b"<<<<<<< ", b">>>>>>> ")) or line in (b"<<<<<<<\n", b">>>>>>>\n"):
                    bad.append(f"{name}:{i}")
    assert not bad, f"merge-conflict markers left in: {bad}"
