"""The examples in examples/ run as documented (tiny random checkpoints; subprocesses)."""

from __future__ import annotations

import os

import numpy as np
import soundfile as sf

import qtts
import qtts.cli
from support.examples import EXAMPLES, read_wav, run_example
from support.server_util import start_server


def test_every_example_is_short():
    for name in os.listdir(EXAMPLES):
        with open(os.path.join(EXAMPLES, name), encoding="utf-8") as fh:
            assert len(fh.read().splitlines()) < 50, name


def test_say_example(tiny_snapshot, tmp_path):
    ref = tmp_path / "ref.wav"
    t = np.arange(3 * 24000) / 24000
    sf.write(ref, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 24000)
    out = tmp_path / "out.wav"
    stdout = run_example("say.py", tiny_snapshot("base"), str(ref), "Hello there.", str(out),
                         "--ref-text", "A reference.", "--max-frames", "12")
    assert "finish_reason=" in stdout
    assert len(read_wav(out)) <= 12 * 1920


def test_stream_play_example(tiny_snapshot, tmp_path):
    pcm = tmp_path / "out.raw"
    stdout = run_example("stream_play.py", tiny_snapshot("custom_voice"), "vivian", "Hello there.",
                         "--pcm", str(pcm), "--max-frames", "12")
    assert "first audio after" in stdout and "done:" in stdout
    assert os.path.getsize(pcm) % (2 * 1920) == 0 and os.path.getsize(pcm) > 0


def test_with_plan_example(tiny_snapshot, tmp_path):
    model = tiny_snapshot("custom_voice")
    for b in (8, 2):
        assert qtts.cli.main(["export", "vocoder", "--model", model, "--chunk-frames", str(b),
                              "-o", str(tmp_path / f"voc{b}.onnx"), "--frames", "24"]) == 0
    out = tmp_path / "plan.wav"
    stdout = run_example("with_plan.py", model, str(tmp_path / "voc8.onnx"), str(tmp_path / "voc2.onnx"),
                         "vivian", "Hello there.", str(out))
    assert "onnx vocoder" in stdout
    read_wav(out)


def test_client_example(tiny_snapshot, tmp_path):
    engine = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
    srv, _ = start_server(engine, max_frames=8)
    try:
        out = tmp_path / "client.wav"
        run_example("client.py", srv.url + "/v1", "vivian", "Hello from qtts.", str(out))
        assert len(read_wav(out)) == 8 * 1920
    finally:
        srv.stop()
