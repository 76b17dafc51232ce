"""qtts say --live: stdin read incrementally (fed in pieces with pauses), PCM on stdout as it arrives."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import qtts
from qtts.audio.chunk import float_to_int16
from qtts.cli import main
from qtts.options import SynthesisOptions

TEXT = "Hi there, 42 cats; ça va?"
FRAMES = 16


def test_live_stdin_pieces_to_pcm(tiny_snapshot):
    snap = tiny_snapshot(kind="custom_voice")
    tts = qtts.load(snap, threads=1)
    opts = SynthesisOptions(greedy=True, max_frames=FRAMES, split_sentences=False, non_streaming_text=False)
    want = b"".join(float_to_int16(c.samples).tobytes() for c in tts.stream(TEXT, speaker="vivian", options=opts))
    cmd = [sys.executable, "-m", "qtts", "say", "--live", "-f", "-", "-o", "-", "--model", snap, "--speaker",
           "vivian", "--greedy", "--max-frames", str(FRAMES), "--threads", "1", "-q"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    out, first = bytearray(), threading.Event()

    def read():
        while data := proc.stdout.read1(65536):
            out.extend(data)
            first.set()

    reader = threading.Thread(target=read)
    reader.start()
    head = b"Hi there, 42 ca"
    for i in range(0, len(head), 4):  # pieces with pauses, then wait for audio before the rest
        proc.stdin.write(head[i : i + 4])
        proc.stdin.flush()
        threading.Event().wait(0.05)
    assert first.wait(120), proc.stderr.read().decode()[-2000:]  # audio before the text is complete
    rest = TEXT.encode()[len(head):]
    proc.stdin.write(rest[:3])  # "ts;" then a split multi-byte "ç"
    proc.stdin.flush()
    proc.stdin.write(rest[3:5])
    proc.stdin.flush()
    proc.stdin.write(rest[5:])
    proc.stdin.close()
    assert proc.wait(120) == 0, proc.stderr.read().decode()[-2000:]
    reader.join(10)
    assert bytes(out) == want


def test_live_flag_errors(tiny_snapshot, tmp_path):
    snap = tiny_snapshot(kind="custom_voice")
    base = ["say", "--live", "--model", snap, "--speaker", "vivian", "-o", str(tmp_path / "x.wav")]
    assert main(base) == 2  # no -f
    assert main([*base, "-f", str(tmp_path / "missing.txt")]) == 2
    assert main([*base, "-f", "-", "--non-streaming-text"]) == 2
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main([*base, "-f", str(text), "--greedy", "--max-frames", "4", "--threads", "1", "-q"]) == 0
