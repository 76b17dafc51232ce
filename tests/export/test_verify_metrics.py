"""The predictor-logit SNR of qtts verify plan counts only the heads whose inputs were still equal."""

from __future__ import annotations

import numpy as np

from qtts.audio.chunk import snr_db
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
