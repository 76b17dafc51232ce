"""qtts say / voice create / voice show / demo on tiny random checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from qtts.cli import main

FRAMES = 5
COMMON = ["--max-frames", str(FRAMES), "--seed", "1", "--threads", "1", "-q", "--no-split"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch at one thread for this module


@pytest.fixture(scope="module")
def ref_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.flac"
    t = np.arange(48000 * 2) / 48000
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32), 48000)
    return str(path)


def _check_wav(path, frames=FRAMES):
    data, sr = sf.read(str(path), dtype="int16", always_2d=True)
    info = sf.info(str(path))
    assert sr == 24000 and data.shape[1] == 1 and info.subtype == "PCM_16"
    assert data.shape[0] == frames * 1920


@pytest.mark.parametrize(
    "kind,layout,args",
    [
        ("base", "0.6b", ["--ref-audio", "REF"]),
        ("base", "0.6b", ["--ref-audio", "REF", "--ref-text", "A reference transcript."]),
        ("custom_voice", "0.6b", ["--speaker", "ryan", "--language", "english"]),
        ("custom_voice", "1.7b", ["--speaker", "eric", "--instruct", "Slowly."]),
        ("voice_design", "1.7b", ["--instruct", "A calm low voice."]),
    ],
)
def test_say_each_mode_writes_wav(tiny_snapshot, ref_wav, tmp_path, capsys, kind, layout, args):
    snap = tiny_snapshot(kind=kind, layout=layout)
    out = tmp_path / "out.wav"
    args = [ref_wav if a == "REF" else a for a in args]
    rc = main(["say", "Hello there.", "--model", snap, "-o", str(out), "--greedy", *COMMON, *args])
    assert rc == 0, capsys.readouterr().err
    _check_wav(out)


def test_voice_create_show_and_say_stream(tiny_snapshot, ref_wav, tmp_path, capsys):
    snap = tiny_snapshot()
    vfile = tmp_path / "me.voice"
    assert main(["voice", "create", ref_wav, "--model", snap, "--ref-text", "Hi.", "-o", str(vfile),
                 "--threads", "1"]) == 0
    assert main(["voice", "show", str(vfile)]) == 0
    shown = capsys.readouterr().out
    assert "ICL" in shown and "0.6b" in shown
    out = tmp_path / "stream.wav"
    text = tmp_path / "in.txt"
    text.write_text("First line.\nSecond line.", encoding="utf-8")
    assert main(["say", "-f", str(text), "--model", snap, "--voice", str(vfile), "-o", str(out), "--stream",
                 *COMMON]) == 0
    _check_wav(out)


def test_pcm_to_stdout(tiny_snapshot, ref_wav, capsysbinary):
    snap = tiny_snapshot()
    rc = main(["say", "Hello.", "--model", snap, "--ref-audio", ref_wav, "-o", "-", *COMMON])
    pcm = capsysbinary.readouterr().out
    assert rc == 0 and len(pcm) == FRAMES * 1920 * 2
    samples = np.frombuffer(pcm, dtype="<i2")
    assert np.abs(samples).max() <= 32767


def test_summary_line(tiny_snapshot, ref_wav, tmp_path, capsys):
    snap = tiny_snapshot()
    args = [a for a in COMMON if a != "-q"]
    assert main(["say", "Hi.", "--model", snap, "--ref-audio", ref_wav, "-o", str(tmp_path / "a.wav"), *args]) == 0
    err = capsys.readouterr().err
    for key in ("frames=5", "audio=0.40s", "wall=", "rtf=", "ttfa=", "finish_reason="):
        assert key in err
    assert "\r" not in err and err.splitlines()[-1].startswith("qtts: frames=5")  # stderr is no terminal here


@pytest.mark.parametrize(
    "kind,layout,args,listed",
    [
        ("base", "0.6b", ["--speaker", "ryan"], "--ref-audio"),
        ("base", "0.6b", [], "--voice"),
        ("base", "0.6b", ["--ref-audio", "REF", "--language", "klingon"], "english"),
        ("custom_voice", "0.6b", ["--speaker", "nobody"], "ryan"),
        ("custom_voice", "0.6b", ["--speaker", "ryan", "--instruct", "x"], "1.7B"),
        ("custom_voice", "0.6b", ["--ref-audio", "REF"], "ryan"),
        ("voice_design", "1.7b", ["--speaker", "ryan", "--instruct", "x"], "--instruct"),
        ("voice_design", "1.7b", [], "--instruct"),
    ],
)
def test_mode_mismatch_exit_2(tiny_snapshot, ref_wav, tmp_path, capsys, kind, layout, args, listed):
    snap = tiny_snapshot(kind=kind, layout=layout)
    out = tmp_path / "x.wav"
    args = [ref_wav if a == "REF" else a for a in args]
    rc = main(["say", "Hello.", "--model", snap, "-o", str(out), *COMMON, *args])
    err = capsys.readouterr().err
    assert rc == 2 and listed in err, err
    assert not out.exists()


def test_bad_output_path_exit_2(tiny_snapshot, tmp_path, capsys):
    assert main(["say", "Hi.", "--model", tiny_snapshot(), "-o", str(tmp_path / "no" / "x.wav")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["say", "Hi.", "--model", tiny_snapshot(), "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_no_text_exit_2(tiny_snapshot, tmp_path, capsys):
    assert main(["say", "--model", tiny_snapshot(), "-o", str(tmp_path / "x.wav")]) == 2
    assert "no text" in capsys.readouterr().err


def test_demo_runs(tmp_path, capsys):
    out = tmp_path / "demo.wav"
    assert main(["demo", "-o", str(out), "--text", "Hi."]) == 0
    text = capsys.readouterr().out
    assert "noise, not speech" in text and "Qwen/Qwen3-TTS-12Hz-0.6B-Base" in text
    data, sr = sf.read(str(out))
    assert sr == 24000 and data.ndim == 1 and len(data) % 1920 == 0 and len(data) > 0
