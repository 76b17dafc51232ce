"""WebSocket /v1/audio/speech/stream against a real uvicorn on 127.0.0.1 (tiny CustomVoice engines),
with the `websockets` client: piece by piece equals whole, cancel by close, bad input, limits, busy."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import threading
import time

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import qtts
from qtts.server.worker import Job
from support.examples import run_example
from support.server_util import GatedBackend, assert_healthy, metric, start_server, wait_for

TEXT = "Hi there, 42 cats; ça va?"
SESSION = {"voice": "vivian", "response_format": "pcm", "greedy": True, "max_frames": 16}


class CountingBackend:
    """Delegates to a real backend and counts the frames it predicts."""

    def __init__(self, inner):
        self.inner, self.frames = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def predict_frame(self, *args):
        self.frames += 1
        return self.inner.predict_frame(*args)


@pytest.fixture(scope="module")
def live(tiny_snapshot):
    engines = []
    for _ in range(2):
        tts = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
        engines.append(qtts.TTS(dataclasses.replace(tts.components, backend=CountingBackend(tts.components.backend))))
    srv, app = start_server(engines, max_concurrency=2, max_queue=2, max_frames=64, header_timeout_s=1.0,
                            body_timeout_s=1.0, ws_idle_timeout_s=1.5, ws_max_message_chars=2000,
                            ws_max_session_chars=6000, ws_max_sessions_per_client=8)
    srv.ws = srv.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    srv.engines = engines
    yield srv
    srv.stop()


@dataclasses.dataclass
class Result:
    audio: bytes
    events: list
    close_code: int | None

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def error(self) -> dict:
        return next(e["error"] for e in self.events if e["type"] == "error")


def run_session(url: str, messages, delay: float = 0.0) -> Result:
    """Send ``messages`` (dicts as JSON, str/bytes as they are), then read until the server closes.
    A server that closes first (busy, or a bad message) ends the sending; what it sent is read."""
    with connect(url, max_size=None) as ws:
        try:
            for m in messages:
                if isinstance(m, dict):
                    ws.send(json.dumps(m))
                elif isinstance(m, tuple):  # (bytes, text flag): raw frames
                    ws.send(m[0], text=m[1])
                else:
                    ws.send(m)
                if delay:
                    time.sleep(delay)
        except ConnectionClosed:
            pass
        return run_session_reader(ws)


def run_session_reader(ws) -> Result:
    """Read audio and events from an open connection until the server closes it."""
    audio, events = b"", []
    try:
        while True:
            msg = ws.recv(timeout=120)
            if isinstance(msg, bytes):
                audio += msg
            else:
                events.append(json.loads(msg))
    except ConnectionClosed:
        pass
    return Result(audio, events, ws.close_code)


def same_audio(a: bytes, b: bytes) -> bool:
    """Equal PCM up to one step of int16 rounding: text that arrives in pieces cuts the stream's
    chunks elsewhere, and the vocoder stepped over other frame counts may differ by ~1e-6 (seen on
    an AVX-512 CPU), which can flip a sample's rounding; the codes are the same."""
    x, y = np.frombuffer(a, "<i2").astype(np.int32), np.frombuffer(b, "<i2").astype(np.int32)
    return len(x) == len(y) > 0 and int(np.abs(x - y).max()) <= 1


def speak(url: str, pieces, session=None, delay: float = 0.0) -> Result:
    msgs = [{"type": "session.update", "session": session or SESSION}]
    msgs += [{"type": "text.delta", "delta": p} for p in pieces] + [{"type": "text.done"}]
    return run_session(url, msgs, delay)


@pytest.fixture(scope="module")
def whole(live) -> Result:
    return speak(live.ws, [TEXT])


def test_whole_text_session(live, whole):
    assert whole.close_code == 1000
    assert whole.types()[0] == "audio.started" and whole.types()[-1] == "audio.done"
    done = whole.events[-1]
    assert done["finish_reason"] == "length" and done["stats"]["frames"] == 16
    assert done["stats"]["text_chars"] == len(TEXT) and done["stats"]["contexts"] == 1
    assert len(whole.audio) == 16 * 1920 * 2  # pcm s16le


def test_session_speed(live):
    """session.speed stretches the audio as POST's speed does; out of range is invalid_session."""
    got = speak(live.ws, [TEXT[:12], TEXT[12:]], session=dict(SESSION, speed=2.0))
    assert got.close_code == 1000 and len(got.audio) == 16 * 1920  # half the samples, 2 bytes each
    r = run_session(live.ws, [{"type": "session.update", "session": dict(SESSION, speed=5.0)}])
    assert r.close_code == 1008 and r.error()["code"] == "invalid_session" and "speed" in r.error()["message"]


@pytest.mark.parametrize("split", ["chars", "words", "random"])
def test_pieces_equal_whole(live, whole, split):
    pieces = {"chars": list(TEXT), "words": [w + " " for w in TEXT.split(" ")[:-1]] + [TEXT.split(" ")[-1]],
              "random": [TEXT[:3], TEXT[3:4], TEXT[4:11], TEXT[11:12], TEXT[12:20], TEXT[20:]]}[split]
    got = speak(live.ws, pieces, delay=0.01)
    assert got.close_code == 1000 and same_audio(got.audio, whole.audio)


def test_slow_client_and_http_timeouts(live, whole):
    """Deltas 1.2 s apart: longer than the 1 s header/body timeouts and near the idle limit; the
    session goes on (audio and messages keep it active) and equals the whole-text session."""
    words = [w + " " for w in TEXT.split(" ")[:-1]] + [TEXT.split(" ")[-1]]
    got = speak(live.ws, words[:3], delay=1.2)
    assert got.close_code == 1000 and len(got.audio) == len(whole.audio)


def test_close_cancels_generation_within_a_frame(live, monkeypatch):
    at_cancel = []
    original = Job.cancel

    def recording(self):
        if not self.cancel_event.is_set():
            at_cancel.append(sum(e.components.backend.frames for e in live.engines))
        original(self)

    monkeypatch.setattr(Job, "cancel", recording)
    cancelled = metric(live.url, "qtts_requests_cancelled_total")
    session = dict(SESSION, max_frames=64)
    with connect(live.ws) as ws:
        ws.send(json.dumps({"type": "session.update", "session": session}))
        ws.send(json.dumps({"type": "text.delta", "delta": "A long answer that goes on and on. " * 4}))
        while not isinstance(ws.recv(timeout=60), bytes):
            pass
    assert wait_for(lambda: metric(live.url, "qtts_requests_cancelled_total") == cancelled + 1)
    assert wait_for(lambda: metric(live.url, "qtts_in_flight") == 0)
    after = sum(e.components.backend.frames for e in live.engines)
    assert len(at_cancel) == 1 and after - at_cancel[0] <= 2, (at_cancel, after)
    assert speak(live.ws, [TEXT]).close_code == 1000  # the slot is free again


def test_bad_input_each_handled(live, whole):
    s = {"type": "session.update", "session": SESSION}
    done = {"type": "text.done"}
    # empty deltas are ignored; only empty text is an error
    r = run_session(live.ws, [s, {"type": "text.delta", "delta": ""}, {"type": "text.delta", "delta": " \x00 "}, done])
    assert r.close_code == 1008 and "empty" in r.error()["message"]
    # an emoji as two escaped surrogate halves in two messages, control characters: handled
    r = speak(live.ws, ["Hi there, 42 cats; ", "\ud83d", "\ude00\x07 ça va?"])
    r2 = speak(live.ws, ["Hi there, 42 cats; \U0001f600 ça va?"])
    assert r.close_code == r2.close_code == 1000 and same_audio(r.audio, r2.audio)
    # a 1 MB delta, text after done, binary frames, unknown types, invalid JSON
    r = run_session(live.ws, [s, {"type": "text.delta", "delta": "x" * 1_000_000}])
    assert r.close_code == 1009 and r.error()["code"] == "delta_too_long"
    r = run_session(live.ws, [s, {"type": "text.delta", "delta": TEXT}, done, {"type": "text.delta", "delta": "more"},
                              b"\x00\x01", {"type": "nope"}, "{not json"])
    codes = [e["error"]["code"] for e in r.events if e["type"] == "error"]
    assert codes == ["text_after_done", "binary_not_supported", "unknown_type", "invalid_json"]
    assert r.close_code == 1000 and same_audio(r.audio, whole.audio)  # those were reported; the answer went on
    # invalid UTF-8 in a text frame: the WebSocket layer closes with 1007
    r = run_session(live.ws, [s, (b'{"type": "text.delta", "delta": "\xff\xfe"}', True)])
    assert r.close_code == 1007
    # session.update after text, a bad session, an unknown voice
    # (a valid session first: text without any session could also fail on the missing voice first)
    r = run_session(live.ws, [s, {"type": "text.delta", "delta": "Hi"}, s, done])
    assert [e["error"]["code"] for e in r.events if e["type"] == "error"] == ["session_started"]
    assert r.close_code == 1000
    r = run_session(live.ws, [{"type": "session.update", "session": {"temperature": "hot"}}])
    assert r.close_code == 1008 and "temperature" in r.error()["message"]
    r = run_session(live.ws, [{"type": "session.update", "session": dict(SESSION, voice="nobody")}, done])
    assert r.close_code == 1008 and r.error()["code"] == "voice_not_found"
    assert_healthy(live.url)


def test_never_done_and_session_limits(live):
    s = {"type": "session.update", "session": SESSION}
    # no text.done: "Hi" is one utterance (48 frames, under the session's cap of 64), then the
    # session waits for more text without a worker and idles out
    short = {"type": "session.update", "session": dict(SESSION, max_frames=None)}
    r = run_session(live.ws, [short, {"type": "text.delta", "delta": "Hi"}])
    assert r.close_code == 1008 and r.error()["code"] == "idle_timeout" and r.audio
    r = run_session(live.ws, [s] + [{"type": "text.delta", "delta": "y" * 2000}] * 4)
    assert r.close_code == 1008 and r.error()["code"] == "session_text_too_long"
    r = run_session(live.ws, [])  # connects and says nothing
    assert r.close_code == 1008 and r.error()["code"] == "idle_timeout"
    assert_healthy(live.url)


def test_bad_sessions_leave_others_untouched(live, whole):
    bad = [{"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": "z" * 1_000_000}]
    with cf.ThreadPoolExecutor(3) as ex:
        good = ex.submit(speak, live.ws, list(TEXT), None, 0.01)
        bads = [ex.submit(run_session, live.ws, bad) for _ in range(2)]
        assert same_audio(good.result().audio, whole.audio)
        assert all(b.result().close_code == 1009 for b in bads)


def test_busy_server_closes_with_try_again_later(tiny_snapshot):
    """One worker, no queue: a session that only sent session.update holds no worker (an HTTP
    request takes it); a session that wants to speak while the worker is busy gets 1013; the
    waiting session speaks once the worker is free."""
    tts = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
    gate = threading.Event()
    gate.set()
    engine = qtts.TTS(dataclasses.replace(tts.components, backend=GatedBackend(tts.components.backend, gate)))
    srv, _ = start_server(engine, max_queue=0, max_frames=64)
    url = srv.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "max_frames": 8}
    try:
        with connect(url) as waiting, cf.ThreadPoolExecutor(1) as ex:
            waiting.send(json.dumps({"type": "session.update", "session": SESSION}))
            gate.clear()  # the next generation holds the worker at its first frame
            held = ex.submit(httpx.post, srv.url + "/v1/audio/speech", json=body, timeout=120)
            assert wait_for(lambda: metric(srv.url, "qtts_in_flight") == 1)
            r = speak(url, [TEXT])
            assert r.close_code == 1013 and r.error()["code"] == "queue_full"
            gate.set()
            assert held.result().status_code == 200
            for m in ({"type": "text.delta", "delta": TEXT}, {"type": "text.done"}):
                waiting.send(json.dumps(m))
            got = run_session_reader(waiting)
        assert got.close_code == 1000 and got.audio
        assert wait_for(lambda: metric(srv.url, "qtts_in_flight") == 0)
    finally:
        gate.set()
        srv.stop()


def test_live_client_example(live, tmp_path):
    out = tmp_path / "live.pcm"
    stdout = run_example("live_client.py", live.url.replace("http://", "ws://"), "vivian", str(out),
                         "--max-frames", "8")
    assert '"audio.done"' in stdout and "close code 1000" in stdout
    assert out.stat().st_size > 0 and out.stat().st_size % (2 * 1920) == 0
