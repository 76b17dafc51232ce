"""The HTTP server against the real engine on tiny random checkpoints, over real sockets.

A uvicorn server runs on 127.0.0.1 (free port) in a thread; requests go through httpx. Frame
budgets are tiny (a few frames per request) to keep the module fast on 2 cores.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os

import httpx
import numpy as np
import pytest

import qtts
from qtts.audio.chunk import float_to_int16
from qtts.options import SynthesisOptions
from qtts.server.worker import Job
from support.server_util import (
    REQUEST_ID,
    assert_error,
    assert_healthy,
    decode,
    metric,
    start_server,
    wait_for,
    wav_bytes,
)

FRAME_BYTES = 1920 * 2  # one codec frame of 16-bit PCM
MAX_INPUT = 300


@pytest.fixture(scope="module")
def cv(tiny_snapshot, tmp_path_factory):
    """A CustomVoice server with two engines (two generations at once)."""
    path = tiny_snapshot(kind="custom_voice")
    engines = [qtts.load(path, threads=1) for _ in range(2)]
    voices = tmp_path_factory.mktemp("cv-voices")
    srv, app = start_server(engines, voices_dir=str(voices), max_concurrency=2, max_queue=8, max_frames=48,
                            max_input_chars=MAX_INPUT, max_body_bytes=16 * 1024, chunk_frames=4)
    srv.engines, srv.voices_dir, srv.app = engines, str(voices), app
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def base(tiny_snapshot, tmp_path_factory):
    """A Base (voice-cloning) server with voice uploads enabled."""
    engine = qtts.load(tiny_snapshot(kind="base"), threads=1)
    root = tmp_path_factory.mktemp("base")
    voices = root / "voices"
    srv, app = start_server(engine, voices_dir=str(voices), max_frames=16, max_upload_bytes=200 * 1024,
                            chunk_frames=4)
    srv.root, srv.voices_dir = root, voices
    yield srv
    srv.stop()


def speak(url: str, **body) -> httpx.Response:
    body.setdefault("model", "qtts")
    return httpx.post(url + "/v1/audio/speech", json=body, timeout=120)


def offline_pcm(engine, text: str, speaker: str, seed: int, max_frames: int) -> bytes:
    audio = engine.synthesize(text, speaker=speaker,
                              options=SynthesisOptions(seed=seed, max_frames=max_frames, chunk_frames=4))
    return float_to_int16(audio.samples).tobytes()


def test_health_models_openapi(cv):
    r = httpx.get(cv.url + "/health")
    assert r.status_code == 200
    info = r.json()
    assert info["model"]["model_type"] == "custom_voice" and "vivian" in info["model"]["speakers"]
    assert info["max_concurrency"] == 2
    assert REQUEST_ID.match(r.headers["x-request-id"])
    assert httpx.get(cv.url + "/v1/models").json()["data"][0]["id"] == "qtts"
    schema = httpx.get(cv.url + "/openapi.json").json()
    assert {"/v1/audio/speech", "/v1/voices", "/v1/voices/{voice_id}", "/health", "/metrics"} <= set(schema["paths"])


def test_wav_streams_in_chunks_and_equals_offline(cv):
    body = {"input": "Hello there, streaming world.", "voice": "vivian", "seed": 7, "max_frames": 12,
            "response_format": "wav"}
    chunks = []
    with httpx.stream("POST", cv.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        assert r.headers["transfer-encoding"] == "chunked"
        chunks = list(r.iter_raw())
    # first bytes = WAV header + the first vocoder chunk (1 frame), then 2-, 4-, 4-frame chunks
    assert len(chunks) >= 3, [len(c) for c in chunks]
    assert len(chunks[0]) == 44 + 1 * FRAME_BYTES
    data = b"".join(chunks)
    samples = decode(data, "wav")
    assert len(samples) == 12 * 1920 and np.isfinite(samples).all()
    ref = offline_pcm(cv.engines[0], body["input"], "vivian", 7, 12)
    assert data[44:] == ref  # the served stream is the offline synthesis, bit for bit


def test_errors_speak_http_field_names(cv, base):
    """A request that lacks what the checkpoint needs gets the field to send, not CLI flags, and
    model sizes as users spell them (0.6b, not the config's 0b6)."""
    for srv, body, words in ((base, {"input": "No voice."}, ["'voice' (an uploaded voice: POST /v1/voices",
                                                            "'file'", "base 0.6b checkpoint"]),
                             (cv, {"input": "No voice."}, ["'voice' <one of:", "vivian", "custom_voice 0.6b"]),
                             (cv, {"input": "Hi.", "voice": "vivian", "instructions": "Calm."},
                              ["1.7B CustomVoice", "custom_voice 0.6b"])):
        err = assert_error(speak(srv.url, **body), 400, *words)
        assert "--" not in err["message"] and "CLI" not in err["message"] and "0b6" not in err["message"], err


def test_default_format_is_streamed_mp3_and_wav_on_flag(cv):
    """No response_format: MP3 (OpenAI's default), constant-bitrate frames leaving as they are made;
    the same audio as an explicit mp3 request. ``default_response_format="wav"`` restores WAV."""
    body = {"input": "Default format.", "voice": "vivian", "seed": 2, "max_frames": 16}
    with httpx.stream("POST", cv.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
        chunks = [c for c in r.iter_raw() if c]
    data = b"".join(chunks)
    assert len(chunks) >= 3 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0, [len(c) for c in chunks]
    assert len(chunks[0]) < len(data) / 2  # the first bytes left before the end of the generation
    assert data == speak(cv.url, **body, response_format="mp3").content
    samples = decode(data, "mp3")
    assert abs(len(samples) - 16 * 1920) < 3000 and np.isfinite(samples).all()
    srv, _ = start_server(cv.engines[0], default_response_format="wav", max_frames=4)
    try:
        r = speak(srv.url, input="Old default.", voice="ryan")
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav" and r.content[:4] == b"RIFF"
    finally:
        srv.stop()


@pytest.mark.parametrize("fmt", ["pcm", "flac", "mp3", "opus"])
def test_formats_decode(cv, fmt):
    r = speak(cv.url, input="Formats.", voice="ryan", response_format=fmt, seed=1, max_frames=6)
    assert r.status_code == 200, r.text
    samples = decode(r.content, fmt)
    exact = {"pcm": 6 * 1920, "flac": 6 * 1920}
    if fmt in exact:
        assert len(samples) == exact[fmt]
    else:  # lossy codecs pad/trim a little
        assert abs(len(samples) - 6 * 1920) < 3000, len(samples)
    assert np.isfinite(samples).all()


def test_sse_stream(cv):
    body = {"input": "Events.", "voice": "vivian", "seed": 3, "max_frames": 8, "stream_format": "sse",
            "response_format": "pcm"}
    r = speak(cv.url, **body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 8
    import base64

    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert pcm == offline_pcm(cv.engines[0], "Events.", "vivian", 3, 8)


def test_parallel_streams_match_offline(cv):
    """4 streams at once on 2 workers (2 run, 2 queue): each equals its offline synthesis."""
    jobs = [("First voice here.", "vivian", 11), ("Second one.", "ryan", 12), ("Third.", "serena", 13),
            ("And fourth.", "aiden", 14)]
    refs = [offline_pcm(cv.engines[0], t, s, seed, 6) for t, s, seed in jobs]
    with cf.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(speak, cv.url, input=t, voice=s, seed=seed, max_frames=6, response_format="pcm")
                for t, s, seed in jobs]
        results = [f.result() for f in futs]
    for r, ref in zip(results, refs):
        assert r.status_code == 200 and r.content == ref
    assert_healthy(cv.url)


def test_disconnect_cancels_generation(cv, monkeypatch):
    """Closing the connection after the first chunk stops generation: the worker thread ends and
    at most the frame in progress when the server noticed is generated after that (the loop checks
    the request's cancel event before every frame)."""
    app_metrics = cv.app.state.qtts.metrics
    at_cancel = []
    original = Job.cancel

    def recording_cancel(self):
        if not self.cancel_event.is_set():
            at_cancel.append(app_metrics.frames.value())
        original(self)

    monkeypatch.setattr(Job, "cancel", recording_cancel)
    body = {"input": "A long sentence that would take many frames to finish.", "voice": "vivian",
            "seed": 5, "max_frames": 48, "response_format": "wav"}
    before_frames = app_metrics.frames.value()
    before_cancel = metric(cv.url, "qtts_requests_cancelled_total")
    with httpx.stream("POST", cv.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200
        first = next(r.iter_raw())
        assert len(first) == 44 + 1 * FRAME_BYTES  # the 1-frame first chunk
    assert wait_for(lambda: metric(cv.url, "qtts_requests_cancelled_total") == before_cancel + 1, 60)
    assert wait_for(lambda: metric(cv.url, "qtts_in_flight") == 0, 60)  # worker thread returned
    assert len(at_cancel) == 1
    after = app_metrics.frames.value()
    assert after - at_cancel[0] <= 1, (before_frames, at_cancel, after)
    assert after - before_frames < 48  # the 48-frame budget was not used up
    assert_healthy(cv.url)


def test_metrics_text(cv):
    speak(cv.url, input="Metrics.", voice="vivian", max_frames=2)
    text = httpx.get(cv.url + "/metrics").text
    for name in ("qtts_requests_total", "qtts_errors_total", "qtts_audio_seconds_total", "qtts_rtf_bucket",
                 "qtts_ttfa_seconds_bucket", "qtts_queue_depth", "qtts_in_flight"):
        assert name in text
    assert metric(cv.url, "qtts_requests_total", route="/v1/audio/speech", method="POST", status="200") >= 1
    assert metric(cv.url, "qtts_ttfa_seconds_count") >= 1


def _hostile_cases(max_input: int) -> list[tuple]:
    """(name, method, path, request kwargs, status, words expected in the message)."""
    ok = {"model": "qtts", "input": "hi", "voice": "vivian", "max_frames": 2}
    js = {"content-type": "application/json"}
    sp = "/v1/audio/speech"
    return [
        ("bad json", "POST", sp, {"content": b'{"input": "hi",', "headers": js}, 400, ["not valid JSON"]),
        ("json array", "POST", sp, {"json": ["input", "hi"]}, 400, []),
        ("json string", "POST", sp, {"json": "hi"}, 400, []),
        ("input wrong type", "POST", sp, {"json": {**ok, "input": 123}}, 400, ["input"]),
        ("input null", "POST", sp, {"json": {**ok, "input": None}}, 400, ["input"]),
        ("input missing", "POST", sp, {"json": {"voice": "vivian"}}, 400, ["'input' is required"]),
        ("input empty", "POST", sp, {"json": {**ok, "input": ""}}, 400, ["empty"]),
        ("input whitespace", "POST", sp, {"json": {**ok, "input": " \n\t "}}, 400, ["empty"]),
        ("input control chars", "POST", sp, {"json": {**ok, "input": "\x00\x01\x02"}}, 400, ["empty"]),
        ("input too long", "POST", sp, {"json": {**ok, "input": "a" * (max_input + 1)}}, 400, ["limit"]),
        ("body too large", "POST", sp, {"json": {**ok, "input": "b" * 40000}}, 413, ["too large"]),
        ("unknown voice", "POST", sp, {"json": {**ok, "voice": "alice"}}, 404, ["unknown voice", "vivian"]),
        ("voice traversal", "POST", sp, {"json": {**ok, "voice": "../../etc/passwd"}}, 400, ["invalid voice"]),
        ("voice absolute", "POST", sp, {"json": {**ok, "voice": "/etc/passwd"}}, 400, ["invalid voice"]),
        ("voice encoded", "POST", sp, {"json": {**ok, "voice": "%2e%2e%2fx"}}, 400, ["invalid voice"]),
        ("voice wrong type", "POST", sp, {"json": {**ok, "voice": ["vivian"]}}, 400, ["voice"]),
        ("format aac", "POST", sp, {"json": {**ok, "response_format": "aac"}}, 400, ["wav", "pcm", "flac"]),
        ("speed 5", "POST", sp, {"json": {**ok, "speed": 5}}, 400, ["speed", "4"]),
        ("speed 0.1", "POST", sp, {"json": {**ok, "speed": 0.1}}, 400, ["speed", "0.25"]),
        ("speed string", "POST", sp, {"json": {**ok, "speed": "fast"}}, 400, ["speed"]),
        ("max_frames negative", "POST", sp, {"json": {**ok, "max_frames": -5}}, 400, ["max_frames"]),
        ("max_frames over cap", "POST", sp, {"json": {**ok, "max_frames": 10**6}}, 400, ["limit"]),
        ("unknown field", "POST", sp, {"json": {**ok, "temprature": 0.5}}, 400, ["unknown field", "temprature"]),
        ("temperature zero", "POST", sp, {"json": {**ok, "temperature": 0}}, 400, ["temperature"]),
        ("temperature NaN", "POST", sp, {"content": b'{"input":"hi","voice":"vivian","temperature":NaN}',
                                         "headers": js}, 400, ["temperature"]),
        ("top_p > 1", "POST", sp, {"json": {**ok, "top_p": 1.5}}, 400, ["top_p"]),
        ("seed string", "POST", sp, {"json": {**ok, "seed": "abc"}}, 400, ["seed"]),
        ("seed bool", "POST", sp, {"json": {**ok, "seed": True}}, 400, ["seed"]),
        ("stream_format bad", "POST", sp, {"json": {**ok, "stream_format": "chunks"}}, 400, ["stream_format"]),
        ("unknown language", "POST", sp, {"json": {**ok, "language": "klingon"}}, 400, ["language"]),
        ("instructions conflict", "POST", sp, {"json": {**ok, "instructions": "a", "instruct": "b"}}, 400, []),
        ("instruct on 0.6B", "POST", sp, {"json": {**ok, "instructions": "whisper"}}, 400, ["instruct"]),
        ("text/plain", "POST", sp, {"content": b"hello", "headers": {"content-type": "text/plain"}}, 415,
         ["application/json"]),
        ("form encoded", "POST", sp, {"data": {"input": "hi"}}, 415, ["application/json"]),
        ("GET speech", "GET", sp, {}, 405, ["not allowed"]),
        ("unknown route", "GET", "/v1/nothing", {}, 404, ["no such endpoint"]),
        ("delete traversal", "DELETE", "/v1/voices/%2e%2e", {}, 400, ["invalid"]),
        ("delete dotted", "DELETE", "/v1/voices/a.b", {}, 400, ["invalid"]),
        ("delete unknown", "DELETE", "/v1/voices/nobody", {}, 404, ["unknown voice"]),
        ("delete speaker", "DELETE", "/v1/voices/vivian", {}, 400, ["built-in"]),
        ("upload as json", "POST", "/v1/voices", {"json": {"file": "x"}}, 415, ["multipart"]),
        ("clone on CustomVoice", "POST", "/v1/voices", {"files": {"file": ("a.wav", wav_bytes(), "audio/wav")}},
         400, ["Base"]),
    ]


def test_hostile_requests(cv):
    """Each malformed/hostile request gets its status and an OpenAI-style message; the server stays up."""
    sentinel = os.path.join(os.path.dirname(cv.voices_dir), "sentinel.voice")
    open(sentinel, "w").write("keep")
    cases = _hostile_cases(MAX_INPUT)
    assert len(cases) >= 25
    with httpx.Client(base_url=cv.url, timeout=60) as client:
        for name, method, path, kwargs, status, words in cases:
            try:
                assert_error(client.request(method, path, **kwargs), status, *words)
            except (AssertionError, httpx.HTTPError) as exc:  # name the case, also for a reset connection
                raise AssertionError(f"case {name!r}: {exc!r}") from exc
            assert_healthy(cv.url)
        # encoded traversal out of the voices dir never reaches a file
        r = client.delete("/v1/voices/..%2Fsentinel")
        assert r.status_code in (400, 404)
    assert open(sentinel).read() == "keep"
    assert metric(cv.url, "qtts_errors_total", route="/v1/audio/speech", kind="500") == 0


def test_voice_upload_use_delete(base):
    url = base.url
    files = {"file": ("ref.wav", wav_bytes(1.5), "audio/wav")}
    r = httpx.post(url + "/v1/voices", files=files, data={"name": "alice"}, timeout=120)
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "alice" and (base.voices_dir / "alice.voice").is_file()
    listed = httpx.get(url + "/v1/voices").json()["data"]
    assert {"id": "alice", "type": "voice"}.items() <= listed[0].items()
    # a second upload with the same name conflicts
    assert_error(httpx.post(url + "/v1/voices", files=files, data={"name": "alice"}, timeout=60), 409, "exists")
    r = speak(url, input="Cloned speech.", voice="alice", seed=2, max_frames=4, response_format="pcm")
    assert r.status_code == 200 and len(r.content) == 4 * FRAME_BYTES
    # with a transcript the voice keeps reference codes (ICL cloning); ids are generated when unnamed
    r = httpx.post(url + "/v1/voices", files={"file": ("ref.flac", _flac(wav_bytes(2.0, seed=3)), "audio/flac")},
                   data={"ref_text": "This is the reference transcript."}, timeout=120)
    assert r.status_code == 201, r.text
    icl_id = r.json()["id"]
    assert icl_id.startswith("voice_") and r.json()["ref_text"] == "This is the reference transcript."
    voice = qtts.Voice.load(str(base.voices_dir / f"{icl_id}.voice"))
    assert voice.icl and voice.ref_codes.shape[1] == 16
    r = speak(url, input="In context.", voice=icl_id, seed=2, max_frames=3, response_format="pcm")
    assert r.status_code == 200 and len(r.content) == 3 * FRAME_BYTES
    assert httpx.delete(url + "/v1/voices/" + icl_id).json()["deleted"] is True
    assert httpx.delete(url + "/v1/voices/alice").json()["deleted"] is True
    assert_error(speak(url, input="gone", voice="alice"), 404, "unknown voice")
    # without a voice a Base model cannot speak: a clear 400
    assert_error(speak(url, input="no voice"), 400, "voice")


def _flac(wav: bytes) -> bytes:
    import io

    import soundfile as sf

    data, sr = sf.read(io.BytesIO(wav), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, data, sr, format="FLAC")
    return buf.getvalue()


def test_hostile_uploads(base):
    url = base.url
    outside = base.root / "evil.voice"
    cases = [
        ({"files": {"file": ("x.wav", b"not audio at all" * 10, "audio/wav")}}, 400, "not readable audio"),
        ({"files": {"file": ("x.wav", b"", "audio/wav")}}, 400, "empty"),
        ({"files": {"file": ("x.wav", b"\0" * 300_000, "audio/wav")}}, 413, "too large"),
        ({"files": {"file": ("x.wav", wav_bytes(0.3), "audio/wav")}}, 400, "at least 1 s"),
        ({"files": {"file": ("x.wav", wav_bytes(), "audio/wav")}, "data": {"name": "../evil"}}, 400, "invalid"),
        ({"files": {"file": ("x.wav", wav_bytes(), "audio/wav")}, "data": {"name": "/tmp/evil"}}, 400, "invalid"),
        ({"data": {"name": "nofile"}, "files": {"other": ("x", b"x")}}, 400, "file"),
        ({"content": b"--zz\r\ngarbage", "headers": {"content-type": "multipart/form-data; boundary=zz"}}, 400, ""),
    ]
    for i, (kwargs, status, word) in enumerate(cases):
        try:
            r = httpx.post(url + "/v1/voices", timeout=60, **kwargs)
            assert_error(r, status, word) if word else assert_error(r, status)
        except (AssertionError, httpx.HTTPError) as exc:  # name the case, also for a reset connection
            raise AssertionError(f"upload case {i} ({status} {word!r}): {exc!r}") from exc
        assert_healthy(url)
    assert not outside.exists()
    assert sorted(os.listdir(base.voices_dir)) == []  # no temp files left behind


def test_made_up_http_methods_do_not_grow_the_metrics(cv):
    """Every distinct request method was a new label set of qtts_requests_total: a client sending made-up
    methods could grow /metrics (and the server's memory) without bound. Unknown methods count as OTHER."""
    with httpx.Client(base_url=cv.url) as client:
        for i in range(40):
            assert client.request(f"X{i}", "/v1/audio/speech").status_code in (400, 404, 405, 501)
    text = httpx.get(cv.url + "/metrics").text
    assert 'method="X' not in text
    assert metric(cv.url, "qtts_requests_total", route="/v1/audio/speech", method="OTHER", status="405") >= 40
