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


def test_say_with_onnx_plan_and_torch_blocked(tiny_snapshot, tiny_bundle, tmp_path):
    snapshot = tiny_snapshot(kind="custom_voice")
    bundle = tiny_bundle("custom_voice", "--vocoder-first", "2", "--vocoder-main", "4")  # test_onnx_engine's fp32
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


CLONE_BLOCKED = """
import sys
sys.modules["torch"] = None  # any 'import torch' now raises ImportError
import numpy as np
import qtts
from qtts.options import SynthesisOptions
snapshot, plan, wav, out = sys.argv[1:5]
tts = qtts.load(snapshot, plan=plan, threads=1)
voice = tts.create_voice(wav, ref_text="What the reference says.")
voice.save(out + ".voice")
opts = SynthesisOptions(greedy=True, max_frames=10, watchdog=False, split_sentences=False)
np.save(out + ".npy", tts.synthesize("Cloned without torch.", voice=voice, language="english", options=opts).samples)
assert sys.modules["torch"] is None
"""


def test_clone_with_onnx_encoders_and_torch_blocked(tiny_snapshot, tmp_path):
    """create_voice (ONNX speaker + speech encoders, soxr resampling of a 44.1 kHz stereo file) and an
    ICL synthesis with torch unimportable: the same voice and the same audio as the torch path."""
    import numpy as np

    import qtts
    from qtts.options import SynthesisOptions
    from qtts.voice import Voice
    from support.parity_e2e import assert_same_audio

    snapshot = tiny_snapshot(kind="base")
    bundle = str(tmp_path / "bundle")
    assert qtts_main(["export", "onnx", "--model", snapshot, "-o", bundle, "--vocoder-first", "2",
                      "--vocoder-main", "4"]) == 0  # fmt: skip
    rng = np.random.default_rng(0)
    t = np.arange(int(1.5 * 44100)) / 44100
    stereo = np.stack([0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(3 * t)) * t) + 0.03 * rng.standard_normal(len(t))
                       for _ in range(2)], axis=1)  # fmt: skip
    wav = str(tmp_path / "ref.wav")
    sf.write(wav, stereo, 44100, subtype="PCM_16")
    out = str(tmp_path / "blocked")
    proc = subprocess.run([sys.executable, "-c", CLONE_BLOCKED, snapshot, os.path.join(bundle, "plan.json"), wav, out],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]

    got = Voice.load(out + ".voice")
    tts = qtts.load(snapshot, threads=1)
    ref = tts.create_voice(wav, ref_text="What the reference says.")
    np.testing.assert_allclose(got.speaker, ref.speaker, atol=1e-5 * float(np.abs(ref.speaker).max()))
    assert got.ref_codes.shape == ref.ref_codes.shape == (19, 16)  # ceil(1.5 s * 24000 / 1920)
    np.testing.assert_array_equal(got.ref_codes, ref.ref_codes)
    opts = SynthesisOptions(greedy=True, max_frames=10, watchdog=False, split_sentences=False)
    want = tts.synthesize("Cloned without torch.", voice=ref, language="english", options=opts).samples
    assert_same_audio(np.load(out + ".npy"), want, "torch-blocked ICL clone vs torch")
