"""``qtts serve --max-batch 4``: a request's audio does not depend on the requests stepped with it.

A real server process on a knife-edge tiny CustomVoice checkpoint (``support.knife_edge``: every
frame's code 0 is a tie that only the rounding order breaks, so a last-bit difference in a row's
logits changes the codes and so the audio), with no ``--plan`` (the ``fast`` preset,
built on first use), ``--plan faithful`` (fp32 ONNX) and ``--plan torch`` (the fp32 reference): four requests one by one, then
all four at once, greedy and seeded; each response's PCM bytes are the same both ways. (Before the
batch backends computed a row the same way for any row count, int8 MatMulNBits rows and torch's
MKL rows differed with the batch size: tests/engine/test_batch_invariance.py. On this checkpoint the
torch case fails on ac174d3^, all four requests, and the default case on f3eb005^, one of four.)
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
import time

import httpx
import pytest

from cli.test_cmd_serve import _free_port
from support.knife_edge import knife_edge_checkpoint

JOBS = [("First voice here, a short one.", "vivian"), ("Second one, a little longer than the first.", "ryan"),
        ("Third.", "serena"), ("And the fourth line, of a medium length.", "aiden")]  # fmt: skip


@pytest.fixture(scope="module", params=["default", "faithful", "torch"])
def url(request, tiny_snapshot, tmp_path_factory):
    plan = request.param
    port = _free_port()
    model = knife_edge_checkpoint(tiny_snapshot(kind="custom_voice"), str(tmp_path_factory.mktemp("edge") / "ckpt"))
    env = {k: v for k, v in os.environ.items() if k != "QTTS_PLAN"}  # the default plan, as `qtts serve -m M` runs
    env["QTTS_CACHE"] = str(tmp_path_factory.mktemp("serve-cache"))
    cmd = [sys.executable, "-m", "qtts", "serve", "--model", model, "--port", str(port),
           "--max-batch", "4", "--max-frames", "20", "--threads", "1"]  # fmt: skip
    if plan != "default":
        cmd += ["--plan", plan]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # the first start builds the fast plan
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        health = httpx.get(base + "/health", timeout=5).json()
        assert health["max_batch"] == 4
        yield base
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    if plan != "torch":
        assert ("fast" if plan == "default" else plan) in err  # the preset was built / opened, not torch


def _speak(base: str, text: str, voice: str, **extra) -> bytes:
    body = {"model": "qtts", "input": text, "voice": voice, "response_format": "pcm", **extra}
    r = httpx.post(base + "/v1/audio/speech", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_four_requests_alone_and_together_give_the_same_bytes(url, mode):
    extra = [{"greedy": True} if mode == "greedy" else {"seed": 100 + i} for i in range(len(JOBS))]
    alone = [_speak(url, t, v, **e) for (t, v), e in zip(JOBS, extra)]
    with cf.ThreadPoolExecutor(len(JOBS)) as pool:
        together = list(pool.map(lambda a: _speak(url, *a[0], **a[1]), zip(JOBS, extra)))
    assert all(len(a) > 0 for a in alone)
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"request {i} ({mode}): {len(a)} bytes alone, {len(b)} in the batch, or other bytes"


def test_the_knife_edge_checkpoint_ties_every_code0(tiny_snapshot, tmp_path):
    """The checkpoint above keeps its edge: every greedy code 0 is one of the tied pairs."""
    import qtts
    from support.knife_edge import A, B, C, D

    tts = qtts.load(knife_edge_checkpoint(tiny_snapshot(kind="custom_voice"), str(tmp_path / "ckpt")), plan="torch")
    audio = tts.synthesize(JOBS[1][0], speaker="ryan", options=qtts.SynthesisOptions(greedy=True, max_frames=12))
    code0 = audio.codes[:, 0].tolist()
    assert len(code0) == 12 and set(code0) <= {A, B, C, D}, code0
    assert {A, B} & set(code0) and {C, D} & set(code0), code0  # both signs of the tied logit happen
