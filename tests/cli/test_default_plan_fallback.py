"""The default plan on a checkpoint the exporter refuses: the torch reference, with one warning (issue 37).

The exporter shares one RoPE table between the talker and the predictor and refuses a checkpoint
whose two RoPE settings differ; torch runs it. Before the fix, ``qtts say -m M`` with no plan failed
with the exporter's refusal. An explicit ``--plan fast`` still fails: the user asked for that plan.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import soundfile as sf

from qtts.cli import main

REFUSAL = "RoPE differ"


@pytest.fixture
def differing_rope(tiny_snapshot, tmp_path, monkeypatch):
    """A copy of the tiny CustomVoice checkpoint whose predictor RoPE theta differs from the talker's;
    the default plan (QTTS_PLAN unset) and an empty plan cache."""
    snap = tmp_path / "rope"
    shutil.copytree(tiny_snapshot(kind="custom_voice"), snap)
    cfg = json.loads((snap / "config.json").read_text(encoding="utf-8"))
    cfg["talker_config"]["code_predictor_config"]["rope_theta"] = 10000.0
    (snap / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    monkeypatch.delenv("QTTS_PLAN", raising=False)
    monkeypatch.delenv("QTTS_NO_BUILD", raising=False)
    monkeypatch.setenv("QTTS_CACHE", str(tmp_path / "cache"))
    return str(snap)


def _say(snap: str, out, *extra) -> int:
    return main(["say", "Hello.", "-m", snap, "--speaker", "ryan", "--max-frames", "4", "--threads", "1", "-q",
                 "-o", str(out), *extra])  # fmt: skip


def test_default_plan_falls_back_to_torch_with_one_warning(differing_rope, tmp_path, caplog, capsys):
    out = tmp_path / "out.wav"
    with caplog.at_level(logging.WARNING):
        rc = _say(differing_rope, out)
    assert rc == 0, capsys.readouterr().err
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert REFUSAL in warnings[0] and "torch" in warnings[0]
    data, rate = sf.read(str(out))
    assert rate == 24000 and len(data) == 4 * 1920


def test_the_refusal_is_remembered_until_cache_rm_all(differing_rope, tmp_path, monkeypatch, caplog, capsys):
    from qtts.plans import cache

    assert _say(differing_rope, tmp_path / "a.wav") == 0
    monkeypatch.setattr(cache, "build", lambda *a, **k: pytest.fail("the refused build was tried again"))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _say(differing_rope, tmp_path / "b.wav") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and REFUSAL in warnings[0], warnings
    assert main(["cache", "rm", "--all"]) == 0
    assert "forgot the exporter's refusal" in capsys.readouterr().out
    assert not [n for n in os.listdir(cache.bundles_dir()) if n.endswith(cache.REFUSED)]


def test_an_explicit_preset_still_fails(differing_rope, tmp_path, capsys):
    assert _say(differing_rope, tmp_path / "out.wav", "--plan", "fast") == 2
    assert REFUSAL in capsys.readouterr().err
