"""Helpers for the server tests: a live uvicorn server on 127.0.0.1, error-shape checks, metrics."""

from __future__ import annotations

import io
import re
import threading
import time

import httpx
import numpy as np
import soundfile as sf

from qtts.server import ServerSettings, create_app
from qtts.server.runner import ServerThread


def start_server(engine, **settings) -> tuple[ServerThread, object]:
    app = create_app(engine, ServerSettings(**settings))
    return ServerThread(app).start(), app


def assert_error(resp: httpx.Response, status: int, *words: str) -> dict:
    """``resp`` is an OpenAI-style error with ``status`` whose message mentions ``words``."""
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and len(err["message"]) > 10, err
    assert isinstance(err["type"], str) and err["type"], err
    assert isinstance(err["code"], str) and err["code"], err
    for w in words:
        assert w.lower() in err["message"].lower(), (w, err["message"])
    return err


def assert_healthy(url: str) -> None:
    r = httpx.get(url + "/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text


def metric(url: str, name: str, **labels) -> float:
    """One sample of the Prometheus text at /metrics (0 when absent)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    want = "" if not labels else "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in text.splitlines():
        if line.startswith(name + want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(pred, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def decode(data: bytes, fmt: str) -> np.ndarray:
    """Decoded mono float samples (24 kHz) of a response body."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0
    with sf.SoundFile(io.BytesIO(data)) as f:
        assert f.samplerate == 24000 and f.channels == 1
        return f.read(dtype="float32")


def wav_bytes(seconds: float = 1.5, sr: int = 16000, seed: int = 0) -> bytes:
    """A small noisy-tone reference clip as WAV bytes."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(len(t))
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), sr, format="WAV")
    return buf.getvalue()


REQUEST_ID = re.compile(r"^[0-9a-f]{16}$")


class GatedBackend:
    """Delegates to a real backend; each frame waits (at most 60 s) while ``gate`` is clear."""

    def __init__(self, inner, gate: threading.Event):
        self.inner, self.gate = inner, gate

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def predict_frame(self, *args):
        self.gate.wait(60)
        return self.inner.predict_frame(*args)
