"""Running the examples/ scripts from tests (test_examples, the live server tests)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import soundfile as sf

from conftest import REPO_ROOT

EXAMPLES = os.path.join(REPO_ROOT, "examples")


def run_example(name: str, *args: str) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def read_wav(path) -> np.ndarray:
    samples, sr = sf.read(path, dtype="float32")
    assert sr == 24000 and samples.ndim == 1 and len(samples) % 1920 == 0 and len(samples) > 0
    assert np.isfinite(samples).all()
    return samples
