"""Voice uploads against hostile clients, over a real uvicorn on 127.0.0.1 (issue #16):
decompression bombs and lying headers (4xx from the header, no RSS growth), temporary files
removed on every path (429, 503, a client leaving the queue, a failing worker), names reserved
atomically (racing uploads: one 201, the rest 409), whole-string id checks, clean messages."""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import threading
import time

import httpx
import numpy as np
import psutil
import pytest

import qtts
from qtts.server.voices import VoiceStore
from support.hostile_audio import flac_claiming, square_flac, wav_8bit
from support.server_fakes import FakeTTS, FakeVoice
from support.server_util import assert_error, assert_healthy, start_server, wait_for, wav_bytes


class PeakRss:
    """Peak growth of this process's RSS (the server runs in it) while the block runs, sampled
    every 2 ms by a thread."""

    def __enter__(self):
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.endswith(".voice"))


def _upload(url: str, data: bytes, name: str | None = None, ref_text: str | None = None,
            filename: str = "ref.flac", timeout: float = 120) -> httpx.Response:
    form = {k: v for k, v in (("name", name), ("ref_text", ref_text)) if v is not None}
    return httpx.post(url + "/v1/voices", files={"file": (filename, data, "audio/flac")}, data=form,
                      timeout=timeout)


@pytest.fixture(scope="module")
def base(tiny_snapshot, tmp_path_factory):
    """A real tiny Base engine (the whole voice-creation path runs) with uploads enabled."""
    engine = qtts.load(tiny_snapshot(kind="base"), threads=1)
    voices = tmp_path_factory.mktemp("hardening-voices")
    srv, app = start_server(engine, voices_dir=str(voices), max_frames=4)
    srv.voices_dir = voices
    yield srv
    srv.stop()


BOMBS = {
    "31 minutes of FLAC": lambda: square_flac(31 * 60),
    "STREAMINFO claims 2^36-1 samples": lambda: flac_claiming((1 << 36) - 1),
    "8-bit 8 kHz WAV, 4 minutes": lambda: wav_8bit(240),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_get_413_from_the_header(base, name):
    data = BOMBS[name]()
    assert len(data) < 2 * 2**20
    with PeakRss() as rss:
        r = _upload(base.url, data, ref_text="A transcript that would make it an ICL prompt.",
                    filename="bomb.wav" if "WAV" in name else "bomb.flac", timeout=60)
    err = assert_error(r, 413, "the limit is 30 s")
    assert err["code"] == "audio_too_long" and err["param"] == "file"
    assert rss.growth_mb < 200, rss.growth_mb
    assert _leftovers(base.voices_dir) == [] and not list(base.voices_dir.glob("*.voice"))
    assert_healthy(base.url)


def test_unknown_length_and_odd_rate_get_400(base):
    assert_error(_upload(base.url, flac_claiming(0)), 400, "does not state its length")
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.full(47999, 0.1, np.float32), 47999, format="WAV")
    assert_error(_upload(base.url, buf.getvalue(), filename="odd.wav"), 400, "sample rate")
    assert _leftovers(base.voices_dir) == []


def test_messages_show_no_server_paths(base):
    """libsndfile's messages name the file it opened: the temporary upload in the voices dir."""
    for data, word in ((b"RIFF" + b"\0" * 400, "not readable audio"), (b"fLaC" + b"\1" * 400, "not readable"),
                       (wav_bytes(0.3), "at least 1 s")):
        msg = assert_error(_upload(base.url, data, filename="x.wav"), 400, word)["message"]
        assert str(base.voices_dir) not in msg and ".upload-" not in msg and "/" not in msg, msg


def test_public_message_hides_the_voices_dir():
    from qtts.server.errors import public_message
    from qtts.server.routes.voices import _about_upload

    msg = "cannot read '/srv/v/.upload-1.upload.wav' (bad); see /srv/v and /srv/vv/x"
    assert public_message(msg, "/srv/v") == "cannot read '<voices>/...' (bad); see <voices>/... and /srv/vv/x"
    exc = ValueError("cannot read reference audio '/srv/v/.upload-1.upload.wav' (bad)")
    assert _about_upload(exc, "/srv/v/.upload-1.upload.wav") == "cannot read the uploaded 'file' (bad)"


def test_ref_text_is_cleaned_and_bounded_voice_is_created(base):
    r = _upload(base.url, wav_bytes(2.0, sr=24000), ref_text="  Hello\x00 there\x1b.\x07 ")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["ref_text"] == "Hello there."
    voice = qtts.Voice.load(str(base.voices_dir / f"{body['id']}.voice"))
    assert voice.ref_text == "Hello there." and len(voice.ref_codes) <= 30 * 12.5 + 10
    assert_error(_upload(base.url, wav_bytes(), ref_text="\x00\x01"), 400, "ref_text")
    assert httpx.delete(f"{base.url}/v1/voices/{body['id']}").status_code == 200
    assert _leftovers(base.voices_dir) == []


# -- temporary files and names, with a fake engine whose worker can be held ---------------------


class SlowCloneTTS(FakeTTS):
    """FakeTTS whose create_voice waits for ``release`` (and can fail on demand)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def create_voice(self, ref_audio, ref_text=None):
        self.entered.set()
        self.release.wait(30)
        if self.fail:
            raise RuntimeError("worker crashed")
        return super().create_voice(ref_audio, ref_text)


@pytest.fixture()
def fake(tmp_path):
    gate = threading.Event()
    eng = SlowCloneTTS(gate=gate)
    srv, app = start_server([eng, eng], voices_dir=str(tmp_path / "v"), max_concurrency=2, max_queue=0,
                            queue_timeout_s=0.5)
    app.state.qtts.store.loader = FakeVoice.load
    srv.eng, srv.gate, srv.app, srv.voices_dir = eng, gate, app, tmp_path / "v"
    yield srv
    gate.set()
    eng.release.set()
    srv.stop()


def _hold_workers(srv, eng, n: int) -> cf.ThreadPoolExecutor:
    """Occupy ``n`` worker slots of ``srv`` with speech requests held by ``eng``'s gate."""
    pool = cf.ThreadPoolExecutor(n)
    for _ in range(n):
        pool.submit(httpx.post, srv.url + "/v1/audio/speech", json={"input": "held"}, timeout=60)
    assert wait_for(lambda: eng.active == n, 10)
    return pool


def test_no_temp_file_after_429(fake):
    pool = _hold_workers(fake, fake.eng, 2)
    try:
        r = _upload(fake.url, wav_bytes(), name="busy")
        assert_error(r, 429, "busy")
        assert _leftovers(fake.voices_dir) == []
        # the name was given back: it can be used once a worker is free
        fake.gate.set()
        pool.shutdown(wait=True)
        fake.eng.release.set()
        assert _upload(fake.url, wav_bytes(), name="busy").status_code == 201
    finally:
        fake.gate.set()
        pool.shutdown(wait=True)
    assert _leftovers(fake.voices_dir) == []


def test_no_temp_file_after_503_queue_timeout(fake, tmp_path):
    srv, app = start_server(fake.eng, voices_dir=str(tmp_path / "w"), max_concurrency=1, max_queue=1,
                            queue_timeout_s=0.3)
    try:
        pool = _hold_workers(srv, fake.eng, 1)
        assert_error(_upload(srv.url, wav_bytes(), name="late"), 503, "no worker became free")
        assert _leftovers(tmp_path / "w") == []
        fake.gate.set()
        pool.shutdown(wait=True)
    finally:
        srv.stop()


def test_no_temp_file_when_the_client_leaves_the_queue(fake, tmp_path):
    srv, app = start_server(fake.eng, voices_dir=str(tmp_path / "q"), max_concurrency=1, max_queue=1)
    try:
        pool = _hold_workers(srv, fake.eng, 1)
        req = httpx.Request("POST", srv.url + "/v1/voices", files={"file": ("a.wav", wav_bytes())},
                            data={"name": "gone"})
        ctype = req.headers["content-type"]
        body = req.read()
        sock = socket.create_connection((srv.host, srv.port))
        sock.sendall(b"POST /v1/voices HTTP/1.1\r\nHost: localhost\r\nContent-Type: " + ctype.encode()
                     + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert wait_for(lambda: httpx.get(srv.url + "/health").json()["queue_depth"] == 1, 10)
        sock.close()
        assert wait_for(lambda: httpx.get(srv.url + "/health").json()["queue_depth"] == 0, 10)
        assert wait_for(lambda: _leftovers(tmp_path / "q") == [], 10)
        fake.gate.set()
        pool.shutdown(wait=True)
        fake.eng.release.set()
        assert _upload(srv.url, wav_bytes(), name="gone").status_code == 201  # the name is free again
    finally:
        srv.stop()


def test_no_temp_file_when_the_worker_fails(fake):
    fake.eng.fail = True
    fake.eng.release.set()
    r = _upload(fake.url, wav_bytes(), name="crash")
    assert_error(r, 500)
    assert _leftovers(fake.voices_dir) == [] and not (fake.voices_dir / "crash.voice").exists()
    fake.eng.fail = False
    assert _upload(fake.url, wav_bytes(), name="crash").status_code == 201


def test_no_temp_file_when_the_client_leaves_during_creation(fake):
    with cf.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(_upload, fake.url, wav_bytes(), "leaver", None, "ref.flac", 1.0)
        assert fake.eng.entered.wait(10)
        with pytest.raises(httpx.ReadTimeout):
            fut.result()
    fake.eng.release.set()  # the worker finishes after its client left: the voice is kept, temp files go
    assert wait_for(lambda: (fake.voices_dir / "leaver.voice").exists() and _leftovers(fake.voices_dir) == [], 10)
    assert_error(_upload(fake.url, wav_bytes(), name="leaver"), 409, "exists")


def test_racing_names_get_one_201_and_409s(fake):
    """The second upload arrives while the first is being created: 409 at once, no overwrite."""
    with cf.ThreadPoolExecutor(1) as pool:
        first = pool.submit(_upload, fake.url, wav_bytes(seed=1), "dup")
        assert fake.eng.entered.wait(10)
        assert_error(_upload(fake.url, wav_bytes(seed=2), name="dup"), 409, "exists")
        fake.eng.release.set()
        assert first.result().status_code == 201
    saved = (fake.voices_dir / "dup.voice").read_text()
    # many at once: exactly one wins
    with cf.ThreadPoolExecutor(6) as pool:
        codes = sorted(f.result().status_code for f in
                       [pool.submit(_upload, fake.url, wav_bytes(seed=i), "many") for i in range(6)])
    assert codes == [201, 409, 409, 409, 409, 409], codes
    assert (fake.voices_dir / "dup.voice").read_text() == saved
    assert _leftovers(fake.voices_dir) == []


def test_publish_never_replaces_a_voice_made_elsewhere(tmp_path):
    """Another process that wrote the name after the reservation: the link fails, 409."""
    store = VoiceStore(str(tmp_path))
    store.reserve("x1")
    (tmp_path / "x1.voice").write_text("theirs")
    tmp = store.temp_path(".voice.part")
    open(tmp, "w").write("ours")
    with pytest.raises(Exception) as info:
        store.publish(tmp, "x1")
    assert getattr(info.value, "status", None) == 409
    assert (tmp_path / "x1.voice").read_text() == "theirs" and not os.path.exists(tmp)


def test_stale_temp_files_are_swept_on_start(tmp_path):
    old = tmp_path / ".upload-dead.upload"
    new = tmp_path / ".upload-live.upload"
    old.write_bytes(b"x")
    new.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    VoiceStore(str(tmp_path))
    assert not old.exists() and new.exists()


# -- ids: whole-string matches on every route that takes one ------------------------------------


@pytest.mark.parametrize("bad", ["good1\n", "good1\r\n", "\ngood1", "good1\x00", "good 1"])
def test_ids_with_a_trailing_newline_are_refused_everywhere(fake, bad):
    fake.eng.release.set()
    assert_error(_upload(fake.url, wav_bytes(), name=bad), 400, "invalid name id")
    assert _upload(fake.url, wav_bytes(), name="good1").status_code in (201, 409)
    quoted = bad.replace("\n", "%0A").replace("\r", "%0D").replace("\x00", "%00").replace(" ", "%20")
    assert_error(httpx.delete(f"{fake.url}/v1/voices/{quoted}"), 400, "invalid")
    speech = fake.url + "/v1/audio/speech"
    assert_error(httpx.post(speech, json={"input": "hi", "voice": bad}), 400, "invalid voice")
    assert_error(httpx.post(speech, json={"input": "hi", "voice": {"id": bad}}), 400, "invalid voice")
    assert sorted(os.listdir(fake.voices_dir)) == ["good1.voice"]
    assert [v["id"] for v in httpx.get(fake.url + "/v1/voices").json()["data"] if v["type"] == "voice"] == ["good1"]


def test_request_ids_match_whole():
    from qtts.server.middleware import _REQUEST_ID_RE

    assert _REQUEST_ID_RE.fullmatch("abc-1.2_3") and not _REQUEST_ID_RE.fullmatch("abc\n")
