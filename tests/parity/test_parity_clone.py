"""Cloning end to end: ``TTS.create_voice`` vs the official ``create_voice_clone_prompt``.

Reference WAV files (16-bit PCM) at 24 kHz, 16 kHz, 44.1 kHz and 48 kHz stereo go through both
public APIs by path: the official wrapper reads them with ``librosa.load(mono=True)`` and
resamples with ``librosa.resample`` (soxr HQ); qtts reads them with soundfile and resamples with
``qtts.audio.mel.resample`` (the same soxr call). Compared: the speaker vector (fp32 tolerance), the ICL
reference codes (exactly), then a sentence cloned from each voice, greedy, through both public
APIs (audio equal => every code equal; see ``parity_e2e``). The checkpoint has natural EOS, so the
sentence ends where the model says.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

import qtts
from qtts.options import SynthesisOptions
from support.parity_e2e import SPF, assert_same_audio, official_clone

pytestmark = pytest.mark.parity

RATES = {"24k": (24000, 1), "16k": (16000, 1), "44k1": (44100, 1), "48k-stereo": (48000, 2)}
REF_TEXT = "This is what the reference says."
TEXT = "A cloned voice says this."
BUDGET = 90


def reference_wav(path: str, rate: int, channels: int, seconds: float = 1.7) -> str:
    """A voiced, amplitude-modulated sweep with noise (different per channel), written as PCM_16."""
    rng = np.random.default_rng(rate + channels)
    t = np.arange(int(seconds * rate)) / rate
    cols = []
    for c in range(channels):
        f0 = 120 + 50 * np.sin(2 * np.pi * (0.6 + 0.2 * c) * t)
        y = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / rate) + 0.04 * rng.standard_normal(len(t))
        cols.append(y * (0.55 + 0.45 * np.sin(2 * np.pi * 2.5 * t) ** 2))
    sf.write(path, np.stack(cols, axis=1), rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def models(eos_snapshot, official_tts):
    path = eos_snapshot("base", "0.6b")
    return qtts.load(path, threads=1), official_tts(path)


@pytest.mark.parametrize("name", list(RATES))
def test_create_voice_and_clone_equal_official(name, models, tmp_path):
    tts, official = models
    rate, channels = RATES[name]
    wav = reference_wav(str(tmp_path / f"ref-{name}.wav"), rate, channels)
    voice = tts.create_voice(wav, ref_text=REF_TEXT)
    item = official.create_voice_clone_prompt(ref_audio=wav, ref_text=REF_TEXT)[0]

    ref_spk = item.ref_spk_embedding.float().numpy()
    err = np.abs(voice.speaker - ref_spk).max()
    assert err <= 1e-4 * np.abs(ref_spk).max(), f"speaker vector: max abs err {err:.3e}"
    ref_codes = item.ref_code.numpy()
    assert voice.ref_codes.shape == ref_codes.shape == (-(-int(1.7 * 24000) // SPF), 16)
    mismatch = np.argwhere(voice.ref_codes != ref_codes)
    assert mismatch.size == 0, f"ICL codes: first mismatch at (frame, codebook) {tuple(mismatch[0])}"

    opts = SynthesisOptions(greedy=True, max_frames=BUDGET, watchdog=False, split_sentences=False)
    ours = tts.synthesize(TEXT, voice=voice, language="english", options=opts)
    theirs = official_clone(official, TEXT, [item], "english", False, BUDGET)
    assert ours.finish_reason == "eos" and ours.info["frames"] < BUDGET
    assert_same_audio(ours.samples, theirs, f"clone from {name}")
