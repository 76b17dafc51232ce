"""A fresh clone needs nothing outside itself: no test, script or CI file reads the shared folder
beside the checkout of the build machines, and a
representative lane of the suite (every test module that reads the vendored real files) passes in a
clone made into an empty folder, where nothing exists beside it.

The clone is of the committed HEAD (what CI tests); it runs on this environment's interpreter with
``PYTHONPATH`` at the clone's ``src``, so it tests the clone's files, not this checkout's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO_ROOT

#: modules that read the vendored configs, tokenizer files and tensor-name lists
LANE = ["tests/model/test_config.py", "tests/text/test_frontend.py", "tests/model/test_tensor_names.py",
        "tests/model/test_encoder_names.py", "tests/text/test_incremental.py", "tests/backends/test_bundle.py"]  # fmt: skip
_OUTSIDE = re.compile(r"\.\.[/]shared|shared[/]reference")  # [/]: this line is not a match of itself


def _tracked(*roots: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *roots], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_nothing_reads_outside_the_repository():
    bad = []
    for name in _tracked("src", "tests", "scripts", "benchmarks", ".ci", "examples"):
        if name.startswith("tests/data/") or not name.endswith((".py", ".sh", ".toml", "run")):
            continue
        with open(os.path.join(REPO_ROOT, name), encoding="utf-8", errors="replace") as fh:
            bad += [f"{name}:{i}" for i, line in enumerate(fh, 1) if _OUTSIDE.search(line)]
    assert not bad, f"these lines point outside the repository (vendor what they read into tests/data/): {bad}"


def test_lane_passes_in_a_fresh_clone(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    clone = empty / "qtts"
    subprocess.run(["git", "clone", "-q", REPO_ROOT, str(clone)], check=True, capture_output=True, timeout=120)
    assert not (empty / "shared").exists() and sorted(os.listdir(empty)) == ["qtts"]
    env = dict(os.environ, PYTHONPATH=str(clone / "src"), PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-m", "not parity and not slow", *LANE],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    tail = (run.stdout + run.stderr)[-3000:]
    assert run.returncode == 0, tail
    assert re.search(r"\d+ passed", tail) and " failed" not in tail and " error" not in tail, tail
    probe = subprocess.run([sys.executable, "-c", "import qtts, sys; print(qtts.__file__)"], cwd=clone, env=env,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert probe.stdout.strip().startswith(str(clone)), probe.stdout
