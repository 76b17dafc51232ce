"""A hub id resolves, and a cached ONNX plan speaks, on an install without torch (issue 37).

The child process marks torch as not installed (``sys.modules["torch"] = None``: ``import torch``
raises ImportError and ``importlib.util.find_spec("torch")`` answers None, as on a core install),
then runs ``qtts say -m Qwen/...`` against a fake Hugging Face cache holding a copy of the tiny
checkpoint. Before the fix, ``qtts.weights`` imported torch at its top and the command failed with
an install hint for torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import soundfile as sf

HUB_ID = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
REVISION = "0123456789abcdef0123456789abcdef01234567"
NO_TORCH = """
import sys
sys.modules["torch"] = None  # "not installed": import fails, find_spec answers None
from qtts.cli import main
rc = main(sys.argv[1:])
loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] == "torch")
print("torch modules:", loaded, file=sys.stderr)
sys.exit(rc or (3 if loaded else 0))
"""


def fake_hub_cache(root, snapshot: str) -> str:
    """``root`` laid out as a Hugging Face hub cache holding ``snapshot`` as HUB_ID at REVISION."""
    repo = os.path.join(root, "models--" + HUB_ID.replace("/", "--"))
    shutil.copytree(snapshot, os.path.join(repo, "snapshots", REVISION))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w", encoding="utf-8") as fh:
        fh.write(REVISION)
    return root


def test_say_with_a_hub_id_without_torch(tiny_snapshot, tiny_bundle, tmp_path):
    hub = fake_hub_cache(str(tmp_path / "hub"), tiny_snapshot(kind="custom_voice"))
    bundle = tiny_bundle("custom_voice", "--vocoder-first", "2", "--vocoder-main", "4")  # test_onnx_engine's
    plan = os.path.join(bundle, "plan.json")
    out = tmp_path / "out.wav"
    env = {**os.environ, "HF_HUB_CACHE": hub, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", NO_TORCH, "say", "Hello.", "-m", HUB_ID, "--plan", plan, "--speaker", "ryan",
           "--max-frames", "4", "--threads", "1", "-q", "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "torch modules: []" in proc.stderr
    data, rate = sf.read(str(out))
    assert rate == 24000 and len(data) == 4 * 1920
