"""Rough edges a new user met in the CLI (issue 37): what a wrong --plan says, cache rm with a wrong
selector, say -o over an existing file."""

from __future__ import annotations

import pytest

from qtts.cli import main

SAY = ["--speaker", "ryan", "--max-frames", "2", "--threads", "1", "-q", "--plan", "torch"]


@pytest.mark.parametrize("command", ["say", "serve"])
def test_an_unknown_plan_names_the_flag_and_the_presets(tiny_snapshot, tmp_path, capsys, command):
    snap = tiny_snapshot(kind="custom_voice")
    args = ["say", "Hi.", "-m", snap, "-o", str(tmp_path / "a.wav")] if command == "say" else ["serve", "-m", snap]
    assert main([*args, "--plan", "quick"]) == 2
    err = capsys.readouterr().err
    assert "--plan 'quick'" in err and all(p in err for p in ("fast", "faithful", "fastest", "torch")), err
    assert "plan file not found" not in err


@pytest.mark.parametrize("selector,words", [(["--plan", "bogus"], "--plan bogus: not a preset"),
                                            (["no-such-key"], "no cached plan named no-such-key")])
def test_cache_rm_refuses_a_selector_that_cannot_match(capsys, selector, words):
    assert main(["cache", "rm", *selector]) == 2
    assert words in capsys.readouterr().err


def test_say_refuses_to_overwrite_unless_forced(tiny_snapshot, tmp_path, capsys):
    snap = tiny_snapshot(kind="custom_voice")
    out = tmp_path / "out.wav"
    out.write_bytes(b"keep me")
    assert main(["say", "Hi.", "-m", snap, "-o", str(out), *SAY]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err, err
    assert out.read_bytes() == b"keep me"
    assert main(["say", "Hi.", "-m", snap, "-o", str(out), "--force", *SAY]) == 0
    assert out.read_bytes()[:4] == b"RIFF"


def test_side_outputs_refuse_too(tiny_snapshot, tmp_path, capsys):
    snap = tiny_snapshot(kind="custom_voice")
    codes = tmp_path / "codes.npy"
    codes.write_bytes(b"keep me")
    assert main(["say", "Hi.", "-m", snap, "-o", str(tmp_path / "new.wav"), "--codes-out", str(codes), *SAY]) == 2
    assert "--codes-out" in capsys.readouterr().err and codes.read_bytes() == b"keep me"


def test_bench_compare_official_checks_the_package_before_benchmarking(tiny_snapshot, monkeypatch, capsys):
    import sys

    import qtts.tools.bench as bench

    monkeypatch.setitem(sys.modules, "qwen_tts", None)  # "not installed": find_spec answers None
    monkeypatch.setattr(bench, "bench_plan", lambda *a, **k: pytest.fail("benchmarked before the check"))
    assert main(["bench", "-m", tiny_snapshot(kind="custom_voice"), "--plan", "torch", "--compare-official"]) == 2
    assert "official package is needed" in capsys.readouterr().err
