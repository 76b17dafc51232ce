"""benchmarks/sensitivity.py (docs/fidelity.md, "Hadamard rotation") measures how much a talker amplifies
weight errors: on a tiny checkpoint the logit SNR falls with the weight SNR, and the planted checkpoint
amplifies more than the plain one at the same weight SNR."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def sensitivity():
    spec = importlib.util.spec_from_file_location("sensitivity", f"{REPO_ROOT}/benchmarks/sensitivity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_logit_snr_follows_the_weight_snr(sensitivity, snapshot, tmp_path):
    from conftest import REAL_TOKENIZER_DIR
    from qtts.tools.random_checkpoint import write_random_checkpoint

    rows = sensitivity.measure(snapshot, [20.0, 60.0], positions=8, seed=0)
    (_, _, lo20, med20), (_, _, lo60, med60) = rows
    assert med60 > med20 + 20.0 and lo60 > lo20, rows  # 40 dB less weight noise: far cleaner logits
    planted = write_random_checkpoint(str(tmp_path / "p"), size="tiny", kind="custom_voice",
                                      tokenizer_dir=REAL_TOKENIZER_DIR, planted=True)  # fmt: skip
    (_, _, _, planted20), _ = sensitivity.measure(planted, [20.0, 60.0], positions=8, seed=0)
    assert planted20 < med20, (planted20, med20)  # tiny CustomVoice, one run at 19.5 dB: 4.1 vs 12.9 dB median


def test_the_script_prints_a_table(sensitivity, snapshot, capsys):
    assert sensitivity.main(["-m", snapshot, "--snr", "30", "--positions", "4"]) == 0
    out = capsys.readouterr().out
    assert "| checkpoint | weight SNR dB |" in out and "| 30.0 |" in out and "Random weights" in out
