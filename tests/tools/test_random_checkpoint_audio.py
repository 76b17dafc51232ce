"""Random checkpoints make audio that depends on the codes, so waveform checks test the codes.

The speech-tokenizer decoder of a random snapshot is initialised fan-in scaled
(``qtts.tools.random_weights``): speech-like level, and different codes give different audio. Every
audio-level parity check (``parity_e2e.assert_same_audio``: >= 70 dB) therefore fails on a single
wrong code, which costs 14-23 dB here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qtts.audio.chunk import snr_db
from qtts.weights import load_checkpoint


@pytest.fixture(scope="module")
def decode(tiny_snapshot):
    dec = load_checkpoint(tiny_snapshot(), components=("decoder",)).speech_tokenizer.decoder.eval()

    def run(codes: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return dec(torch.from_numpy(np.ascontiguousarray(codes.T))[None]).reshape(-1).numpy()

    return run


def _codes(seed: int, frames: int = 20) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (frames, 16)).astype(np.int64)


def test_speech_like_level(decode):
    for seed in range(2):
        y = decode(_codes(seed))
        rms = float(np.sqrt(np.mean(y.astype(np.float64) ** 2)))
        assert 0.03 <= rms <= 0.3, rms  # about -30 to -10 dBFS
        assert np.abs(y).max() < 0.99  # no clipping at the final clamp
        assert np.std(y) > 0.5 * rms  # a waveform, not an offset


def test_different_codes_give_different_audio(decode):
    for seed in range(2):
        a, b = decode(_codes(2 * seed)), decode(_codes(2 * seed + 1))
        assert snr_db(a, b) < 10.0


def test_one_changed_code_is_far_below_the_parity_bound(decode):
    """A single code (any codebook, any frame, the last one included) moves the audio by > 30 dB
    of the >= 70 dB the audio comparisons ask for."""
    base = _codes(7)
    ref = decode(base)
    rng = np.random.default_rng(8)
    spots = [(19, 0), (19, 15), (0, 15)] + [tuple(rng.integers(0, (20, 16))) for _ in range(3)]
    for frame, book in spots:
        codes = base.copy()
        codes[frame, book] = (codes[frame, book] + 1 + rng.integers(0, 2046)) % 2048
        snr = snr_db(ref, decode(codes))
        assert snr < 40.0, f"frame {frame} codebook {book}: {snr:.1f} dB"


def test_synthesized_audio_depends_on_the_voice(real_tts):
    """End to end: two x-vector voices, same text, greedy -> different codes -> different audio."""
    import qtts
    from qtts.options import SynthesisOptions

    hidden = real_tts.config.talker.hidden_size
    opts = SynthesisOptions(greedy=True, max_frames=12, watchdog=False)
    rng = np.random.default_rng(0)
    out = [real_tts.synthesize("Hello there.", voice=qtts.Voice(rng.standard_normal(hidden).astype(np.float32),
                                                                model_size="0b6"), options=opts).samples
           for _ in range(2)]  # fmt: skip
    assert len(out[0]) == len(out[1]) == 12 * 1920
    assert snr_db(out[0], out[1]) < 10.0
