"""The predictor-logit SNR of qtts verify plan counts only the heads whose inputs were still equal."""

from __future__ import annotations

import numpy as np
import pytest

from qtts.audio.chunk import snr_db
from qtts.export.audio_metrics import audio_distances, log_spectral_distance, worst_segment_snr_db
from qtts.export.verify import _default_gate, _forced_heads_snr


def test_forced_heads_stop_at_the_first_differing_code():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((15, 64)).astype(np.float32)
    test = ref + 0.01 * rng.standard_normal(ref.shape).astype(np.float32)
    test[2:] = rng.standard_normal((13, 64))  # after the differing code at head 1: unrelated logits
    codes = np.arange(15)
    other = codes.copy()
    other[1] = 99
    got = _forced_heads_snr((codes, ref), (other, test))
    assert got == snr_db(ref[:2], test[:2]) and got > 35
    assert _forced_heads_snr((codes, ref), (codes, test)) < 10  # all 15 heads when no code differs


def test_default_gate_needs_both_logit_snrs():
    assert _default_gate({"talker_logit_snr_db_min": 30.0, "predictor_logit_snr_db_min": 26.0}) is True
    assert _default_gate({"talker_logit_snr_db_min": 30.0, "predictor_logit_snr_db_min": 20.0}) is False
    assert _default_gate({"talker_logit_snr_db_min": 30.0, "predictor_logit_snr_db_min": None}) is None


def _tone(n: int = 24000 * 2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 24000
    return (np.sin(2 * np.pi * 220 * t) + 0.3 * rng.standard_normal(n)).astype(np.float32)


def test_worst_segment_finds_a_short_burst_the_clip_snr_hides():
    ref = _tone()
    test = ref + 1e-3 * np.random.default_rng(1).standard_normal(len(ref)).astype(np.float32)
    seg = 4080  # 170 ms at 24 kHz
    test[5 * seg : 5 * seg + 400] += 0.3  # a 17 ms burst inside segment 5
    clip, worst = snr_db(ref, test), worst_segment_snr_db(ref, test)
    assert worst == snr_db(ref[5 * seg : 6 * seg], test[5 * seg : 6 * seg])
    assert clip - worst > 8  # the burst costs the clip ~1/11 of what it costs its segment
    assert worst_segment_snr_db(ref, ref) == float("inf")


def test_worst_segment_skips_silence_and_folds_the_tail():
    ref = _tone(4080 * 3 + 100)
    ref[:4080] = 0.0  # a silent first segment: its SNR would be -inf-like noise, skipped
    test = ref.copy()
    test[:4080] = 1e-3
    test[-50:] += 0.5  # the 100-sample tail belongs to the last full segment
    got = worst_segment_snr_db(ref, test)
    assert got == snr_db(ref[2 * 4080 :], test[2 * 4080 :])


def test_log_spectral_distance_sees_a_timbre_change_the_snr_calls_small():
    ref = _tone()
    assert log_spectral_distance(ref, ref) == 0.0
    scaled = ref * 1.1  # +0.83 dB at every bin
    assert abs(log_spectral_distance(ref, scaled) - 20 * np.log10(1.1)) < 1e-4  # the -80 dB floor
    # a 40 dB SNR error concentrated at high frequencies (where the tone has none) vs white noise
    rng = np.random.default_rng(2)
    hiss = np.diff(rng.standard_normal(len(ref) + 1)).astype(np.float32)
    hiss *= np.sqrt(np.sum(ref**2) / np.sum(hiss**2) * 1e-4)
    assert abs(snr_db(ref, ref + hiss) - 40.0) < 1e-3
    assert log_spectral_distance(ref, ref + hiss) > 0.1


def test_distances_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="length"):
        audio_distances(np.zeros(10), np.zeros(11))
    got = audio_distances(_tone(), _tone() * 0.5)
    assert set(got) == {"snr_db", "worst_segment_snr_db", "lsd_db"}
