"""An exported bundle runs with torch made unimportable (``qtts say --plan BUNDLE/plan.json``), and
``qtts.load`` of it never imports the export toolchain."""

from __future__ import annotations

import os
import subprocess
import sys

import soundfile as sf

from qtts.cli import main as qtts_main

BLOCK_TORCH = (
    "import sys; sys.modules['torch'] = None; "  # any 'import torch' now raises ImportError
    "from qtts.cli import main; rc = main(sys.argv[1:]); "
    "assert sys.modules['torch'] is None; sys.exit(rc)"
)
LOAD_ONLY = (
    "import sys; sys.modules['torch'] = None; import qtts; "
    "tts = qtts.load(sys.argv[1], plan=sys.argv[2]); "
    "a = tts.synthesize('Hi.', speaker='serena', options=qtts.SynthesisOptions(seed=1, max_frames=4)); "
    "loaded = sorted(m for m in sys.modules if m.startswith(('qtts.export', 'qtts.cli'))); "
    "assert not loaded, loaded; print(len(a.samples))"
)


def test_say_with_onnx_plan_and_torch_blocked(tiny_snapshot, tmp_path):
    snapshot = tiny_snapshot(kind="custom_voice")
    bundle = str(tmp_path / "bundle")
    argv = [
        "export",
        "onnx",
        "--model",
        snapshot,
        "-o",
        bundle,
        "--vocoder-first",
        "2",
        "--vocoder-main",
        "4",
    ]
    assert qtts_main(argv) == 0
    wav = str(tmp_path / "out.wav")
    cmd = [sys.executable, "-c", BLOCK_TORCH, "say", "--model", snapshot, "--plan", os.path.join(bundle, "plan.json"),
           "--speaker", "serena", "--seed", "1", "--max-frames", "12", "-q", "-o", wav, "Hello there."]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    audio, rate = sf.read(wav, dtype="float32")
    assert rate == 24000 and 0 < len(audio) <= 12 * 1920 and len(audio) % 1920 == 0
    proc = subprocess.run([sys.executable, "-c", LOAD_ONLY, snapshot, os.path.join(bundle, "plan.json")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 0 < int(proc.stdout.strip()) <= 4 * 1920
