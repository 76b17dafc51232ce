"""benchmarks/arm_compare.py, the verdict of the aarch64 lane (benchmarks/arm.sh), on made-up run folders:
equal codes and audio pass, a fp32 code divergence is located and fails, audio under the bound
fails, an int8 divergence is reported without failing, and each side's own consistency is checked."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "arm_compare.py")


@pytest.fixture(scope="module")
def arm_compare():
    spec = importlib.util.spec_from_file_location("arm_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _side(folder, codes: dict, audio: dict) -> str:
    """A run folder like ``arm_lane.py run`` writes: results.json, codes-*.npz, *.wav, say-*.pcm."""
    import soundfile as sf

    os.makedirs(folder)
    names = [f"say {p} greedy -> wav + codes" for p in codes]
    with open(os.path.join(folder, "results.json"), "w") as fh:
        json.dump({"versions": {}, "results": [{"name": n, "rc": 0} for n in names]}, fh)
    for prec, c in codes.items():
        np.savez(os.path.join(folder, f"codes-{prec}.npz"), codes=c)
    for stem, pcm in audio.items():
        sf.write(os.path.join(folder, stem + ".wav"), pcm, 24000, subtype="PCM_16")
        if stem.startswith("say-") and stem.count("-") == 1:
            pcm.astype("<i2").tofile(os.path.join(folder, stem + ".pcm"))
    return str(folder)


def _audio(seed: int, n: int = 4800) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 3000).astype(np.int16)


def _run(tmp_path, arm_compare, arm_codes, arm_audio):
    codes = {"fp32": np.arange(48).reshape(3, 16), "int8": np.arange(48).reshape(3, 16)}
    audio = {stem.format(p=p): _audio(1) for stem, _ in arm_compare.AUDIO for p in codes}  # every file a run writes
    x86 = _side(tmp_path / "x86", codes, {k: v for k, v in audio.items() if "-ref-" not in k})
    arm = _side(tmp_path / "arm", {**codes, **arm_codes}, {**audio, **arm_audio})
    return arm_compare.compare(x86, arm, str(tmp_path / "compare.md"))


def test_equal_runs_pass(tmp_path, arm_compare):
    assert _run(tmp_path, arm_compare, {}, {}) == 0
    text = (tmp_path / "compare.md").read_text()
    assert "| fp32 greedy codes | equal (3 frames x 16) |" in text and "identical" in text
    assert "arm64: fp32: stdout PCM == WAV, decode == say" in text


def test_a_fp32_divergence_is_located_and_fails(tmp_path, arm_compare):
    codes = np.arange(48).reshape(3, 16)
    codes[1, 5] = 999
    assert _run(tmp_path, arm_compare, {"fp32": codes}, {}) == 1
    assert "first divergence at frame 1, codebook 5 (2/3 frames equal)" in (tmp_path / "compare.md").read_text()


def test_audio_under_the_bound_fails_but_int8_from_other_codes_is_only_reported(tmp_path, arm_compare):
    noisy = _audio(1) + (np.random.default_rng(2).standard_normal(4800) * 30).astype(np.int16)
    assert _run(tmp_path / "a", arm_compare, {}, {"say-fp32": noisy, "decode-fp32": noisy}) == 1
    other = np.arange(48).reshape(3, 16) + 1
    assert _run(tmp_path / "b", arm_compare, {"int8": other}, {"say-int8": _audio(5), "decode-int8": _audio(5)}) == 0


def test_snr_and_code_diff(arm_compare):
    a = np.array([1.0, -2.0, 3.0])
    assert arm_compare.snr_db(a, a) == float("inf")
    assert arm_compare.snr_db(a, a * 1.001) == pytest.approx(60.0, abs=0.01)
    assert arm_compare.code_diff(np.zeros((4, 16)), np.zeros((3, 16))).startswith("equal for 3 frames, then lengths")
