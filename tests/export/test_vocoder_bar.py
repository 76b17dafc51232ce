"""The vocoder's bf16 bar (qtts verify plan --vocoder-frames): fp32 streaming meets it, noise does not."""

from __future__ import annotations

import numpy as np
import pytest

from qtts.export.vocoder_bar import meets_bar, vocoder_fidelity


@pytest.fixture(scope="module")
def decoder(tiny_snapshot):
    from qtts.weights import load_checkpoint

    return load_checkpoint(tiny_snapshot(), components=("decoder",)).speech_tokenizer.decoder.float().eval()


class _Noisy:
    """A vocoder whose stream adds white noise at ``snr`` dB below each chunk's power."""

    def __init__(self, inner, snr: float):
        self.inner, self.snr, self.rng = inner, snr, np.random.default_rng(0)

    def stream(self):
        outer, s = self, self.inner.stream()

        class _S:
            def decode(self, codes):
                x = np.asarray(s.decode(codes), np.float32)
                scale = np.sqrt(np.mean(x**2) * 10 ** (-outer.snr / 10))
                return x + scale * outer.rng.standard_normal(x.shape).astype(np.float32)

        return _S()


def test_fp32_streaming_meets_the_bar_and_noise_below_it_does_not(decoder, one_thread):
    from qtts.backends.torch import TorchVocoder

    vocoder = TorchVocoder(decoder, main=8)
    got = vocoder_fidelity(vocoder, decoder, frames=24)
    bar, plan = got["bf16_bar"], got["plan"]
    assert 10 < bar["snr_db"] < 80 and bar["worst_segment_snr_db"] <= bar["snr_db"] and bar["lsd_db"] > 0
    assert plan["snr_db"] > 90 and got["meets_bar"]  # fp32 streamed == offline to rounding
    noisy = vocoder_fidelity(_Noisy(vocoder, bar["snr_db"] - 6), decoder, frames=24)
    assert noisy["bf16_bar"] == bar and not noisy["meets_bar"]
    assert noisy["plan"]["snr_db"] < bar["snr_db"]


def test_meets_bar_needs_every_metric():
    bar = {"snr_db": 30.0, "worst_segment_snr_db": 25.0, "lsd_db": 0.5}
    assert meets_bar(dict(bar), bar)
    assert not meets_bar({**bar, "worst_segment_snr_db": 24.9}, bar)
    assert not meets_bar({**bar, "lsd_db": 0.51}, bar)
    assert not meets_bar({**bar, "snr_db": 29.0}, bar)
