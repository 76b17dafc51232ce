"""Hardening, round 2 (issue 38), against a real ``qtts serve`` process (tiny CustomVoice
checkpoint, one worker slot, a queue of 4; tests/server/processes.py): each attack comes from
127.0.0.1 and a good client from 127.0.0.2 measures its first audio and must get all of its audio
while the attack is still going on. A FLAC client that hangs up frees the slot (cancel counted);
X-Forwarded-For from an address that is not a named proxy buys neither WebSocket sessions nor
queue places; Content-Length with Transfer-Encoding is a 400 and a closed connection; one rule
for empty text; a Host with userinfo is refused; a client over the connection cap reads its 503.
Every wait is bounded; the checks are causal (what was served, in which order, what was counted
at the moment the good client heard its first audio), never timings. Each fails on the commit
before the fix (6de939c^)."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time

import httpx
import pytest
from processes import ATTACKER, GOOD, served
from test_harden_capacity import SESSION as LONG_SESSION
from test_harden_capacity import _closed_with, _connect_from
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.server_fakes import FakeTTS
from support.server_util import assert_error, assert_healthy, metric, start_server, wait_for, wav_bytes

BODY = {"input": "Hi there.", "voice": "vivian", "response_format": "pcm", "max_frames": 4}
GOOD_BYTES = 4 * 1920 * 2  # the good client's whole answer: 4 frames of 16-bit PCM
LONG = "This sentence goes on and on for a client that hangs up at once. " * 12
SESSION = {**LONG_SESSION, "max_frames": 4}  # a session's whole budget: the good one speaks 4 frames
FRAMES = "qtts_frames_generated_total"
CANCELLED = "qtts_requests_cancelled_total"


@pytest.fixture(scope="module")
def server(tiny_snapshot):
    with served("serve", tiny_snapshot(kind="custom_voice"), "--max-queue", "4") as srv:
        yield srv


@pytest.fixture()
def idle(server):
    """The server with nothing in flight or queued, before and after the test."""
    assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0 == metric(server.url, "qtts_queue_depth"), 60)
    yield server
    assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0 == metric(server.url, "qtts_queue_depth"), 60)


class Speech(threading.Thread):
    """One streamed speech request from ``source``: its status, its audio bytes and when (monotonic)
    its first audio came; ``at_first()`` runs when the first audio bytes arrive (result: ``seen``)."""

    def __init__(self, url: str, source: str, body: dict | None = None, headers: dict | None = None, at_first=None):
        super().__init__(daemon=True)
        self.url, self.source, self.body, self.headers, self.at_first = url, source, body or BODY, headers, at_first
        self.status, self.first, self.audio, self.seen = None, None, b"", None

    def run(self) -> None:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=self.source), timeout=120) as client:
            with client.stream("POST", self.url + "/v1/audio/speech", json=self.body, headers=self.headers) as r:
                self.status = r.status_code
                for chunk in r.iter_raw():
                    if chunk and self.first is None:
                        self.first = time.monotonic()
                        self.seen = self.at_first() if self.at_first else None
                    self.audio += chunk


def good_client(srv, at_first=None, wait: bool = True) -> Speech:
    """The good client (127.0.0.2); with ``wait``, it must get its whole answer."""
    good = Speech(srv.url, GOOD, at_first=at_first)
    good.start()
    if wait:
        good.join(180)
        assert good.status == 200 and good.first and len(good.audio) == GOOD_BYTES, (good.status, len(good.audio))
    return good


def raw(srv, data: bytes, source: str = ATTACKER) -> socket.socket:
    sock = socket.create_connection((srv.host, srv.port), timeout=30, source_address=(source, 0))
    sock.sendall(data)
    return sock


def post(body: dict, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + extra.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        sock.close()
    return data


@pytest.mark.parametrize("stream", ["audio", "sse"])
def test_a_flac_client_that_hangs_up_frees_the_slot(idle, stream):
    """(1) A FLAC request for 600 frames whose client hangs up once generation started: when the
    good client hears its first audio, far fewer than 600 frames were generated (the hung-up one
    stopped; before the fix it ran to its end first: FLAC sends nothing before the end, so only a
    watched disconnect stops it), and the cancel is counted."""
    srv = idle
    frames0, cancelled0 = metric(srv.url, FRAMES), metric(srv.url, CANCELLED)
    sock = raw(srv, post({**BODY, "input": LONG, "response_format": "flac", "stream_format": stream,
                          "max_frames": 600}))
    assert wait_for(lambda: metric(srv.url, FRAMES) > frames0, 60)
    sock.close()
    good = good_client(srv, at_first=lambda: metric(srv.url, FRAMES) - frames0)
    assert good.seen < 300, f"{good.seen} frames generated before the good client's first audio"
    assert wait_for(lambda: metric(srv.url, CANCELLED) == cancelled0 + 1, 30), "the hang-up was not counted"


def test_forwarded_for_from_a_client_buys_no_sessions(idle):
    """(2) Five sessions from 127.0.0.1, each with its own X-Forwarded-For: still one client, so
    three are closed with 1013 too_many_sessions; 127.0.0.2 gets its session and its audio while
    the other two stay open."""
    srv = idle
    held = [connect(srv.ws, additional_headers={"X-Forwarded-For": f"10.9.0.{i}"}) for i in range(5)]
    try:
        for h in held:
            with contextlib.suppress(ConnectionClosed):  # (a refused one is closed at once)
                h.send(json.dumps({"type": "session.update", "session": SESSION}))
        refused = [h for h in held[2:] if _closed_with(h) == (1013, ["too_many_sessions"])]
        assert len(refused) == 3 and metric(srv.url, "qtts_live_sessions") == 2, len(refused)
        with _connect_from(srv.ws, GOOD) as good:
            for m in ({"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": "Hi."},
                      {"type": "text.done"}):
                good.send(json.dumps(m))
            while not isinstance(msg := good.recv(timeout=60), bytes):  # to its first audio
                assert json.loads(msg)["type"] != "error", msg
            assert _closed_with(good) == (1000, [])
        assert metric(srv.url, "qtts_live_sessions") == 2  # the attacker's two are still open
    finally:
        for h in held:
            h.close()
    assert wait_for(lambda: metric(srv.url, "qtts_live_sessions") == 0)


def test_forwarded_for_from_a_client_buys_no_queue_places(idle):
    """(3) 127.0.0.1 holds the slot with a long request and fills the queue with four more, each
    with its own X-Forwarded-For: the good client takes the place of the newest (429), and when the
    slot frees (after 150 frames: 127.0.0.1 used it most lately) the good client is served before
    the attacker's queued ones (before the fix: 429 at once)."""
    srv = idle
    frames0 = metric(srv.url, FRAMES)
    hold = raw(srv, post({**BODY, "input": LONG, "max_frames": 2000}))  # pcm, never read: holds the slot
    assert wait_for(lambda: metric(srv.url, "qtts_in_flight") == 1, 60)
    queued = []
    for i in range(4):
        queued.append(Speech(srv.url, ATTACKER, headers={"X-Forwarded-For": f"10.9.1.{i}"}))
        queued[-1].start()
        assert wait_for(lambda n=i + 1: metric(srv.url, "qtts_queue_depth") == n, 30)
    good = good_client(srv, wait=False)
    assert wait_for(lambda: good.status is not None or queued[3].status is not None, 30)
    assert good.status is None and queued[3].status == 429, (good.status, queued[3].status)
    assert wait_for(lambda: metric(srv.url, FRAMES) - frames0 > 150, 120)  # 127.0.0.1 has used the slot most lately
    hold.close()  # the long request stops; the slot goes to the queue by the fair share
    for r in queued[:3] + [good]:
        r.join(180)
    assert good.status == 200 and len(good.audio) == GOOD_BYTES, (good.status, len(good.audio))
    assert [r.status for r in queued[:3]] == [200] * 3
    assert good.first < min(r.first for r in queued[:3])  # next after the long one, not after the queue


def test_content_length_with_transfer_encoding_closes_the_connection(idle):
    """(6) RFC 9112 6.1: answered 400, then closed; the request behind it is not answered."""
    smuggled = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = read_all(raw(idle, smuggled))
    assert data.startswith(b"HTTP/1.1 400 ") and data.count(b"HTTP/1.1 ") == 1, data[:400]
    good_client(idle)


INVISIBLE = ["\u200b\u200d\u2060", "\ufeff", "\x01\x02\x1b", "\u00ad \u200e\t"]


def test_invisible_text_is_empty_everywhere(idle):
    """Text of only format or control characters is empty: 400 over HTTP, the same error on the
    WebSocket, the engine's own check (Wyoming uses it) and ``qtts say`` (exit 2)."""
    from qtts.cli.main import main
    from qtts.errors import InputError
    from qtts.text.prompt import clean_text

    for text in INVISIBLE:
        r = httpx.post(idle.url + "/v1/audio/speech", json={**BODY, "input": text}, timeout=30)
        assert_error(r, 400, "empty")
        with connect(idle.ws) as ws:
            for m in ({"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": text},
                      {"type": "text.done"}):
                ws.send(json.dumps(m))
            code, errors = _closed_with(ws)
        assert errors == ["invalid_value"], (text, code, errors)
        with pytest.raises(InputError, match="empty"):
            clean_text(text)
        assert main(["say", text, "-m", "/nonexistent/model", "-o", "/nonexistent/x.wav"]) == 2  # before the model
    good_client(idle)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}@evil.example", "user@127.0.0.1:{port}", "127.0.0.1:x{port}"])
def test_a_host_with_userinfo_is_refused(server, host):
    """The Host header names this server, nothing more: userinfo or a port that is not one is 403."""
    r = httpx.get(server.url + "/health", headers={"Host": host.format(port=server.port)}, timeout=10)
    assert_error(r, 403, "host")


def test_a_client_over_the_connection_cap_reads_its_503(idle):
    """64 connections held from 127.0.0.1 (its default cap): one more that sends its request at
    once, a small one or a 1 MB upload, sends it all and reads the 503 to a clean end (no TCP reset,
    no broken pipe), every time; 127.0.0.2 is served meanwhile."""
    held = [raw(idle, b"") for _ in range(64)]
    try:
        for size in (100, 1_000_000):
            for _ in range(3):
                sock = raw(idle, post({**BODY, "input": "x" * size}))  # sendall: no BrokenPipeError
                data = b""
                while chunk := sock.recv(65536):  # to EOF: no ConnectionResetError
                    data += chunk
                sock.close()
                assert data.startswith(b"HTTP/1.1 503 ") and b"too many open connections" in data, data[:200]
        good_client(idle)
    finally:
        for s in held:
            s.close()


def test_a_named_proxy_forwards_its_clients(tiny_snapshot):
    """With 127.0.0.1 named a proxy (--forwarded-allow-ips), the addresses it forwards are the
    clients: three sessions through it, each for its own client, are all live."""
    with served("serve", tiny_snapshot(kind="custom_voice"), "--forwarded-allow-ips", "127.0.0.1") as srv:
        held = [connect(srv.ws, additional_headers={"X-Forwarded-For": f"10.9.2.{i}"}) for i in range(3)]
        try:
            for h in held:
                h.send(json.dumps({"type": "session.update", "session": SESSION}))
            assert wait_for(lambda: metric(srv.url, "qtts_live_sessions") == 3)
        finally:
            for h in held:
                h.close()
        assert wait_for(lambda: metric(srv.url, "qtts_live_sessions") == 0)
        assert_healthy(srv.url)


def test_a_control_only_ref_text_is_refused(tmp_path):
    """As docs/server.md says: an upload whose ref_text has nothing to speak is a 400."""
    srv, _ = start_server(FakeTTS(), voices_dir=str(tmp_path))
    try:
        for ref_text in ("\u200b\u2060", "\x01\x02"):
            r = httpx.post(srv.url + "/v1/voices", files={"file": ("a.wav", io.BytesIO(wav_bytes()), "audio/wav")},
                           data={"ref_text": ref_text, "name": "ctl"}, timeout=30)
            assert_error(r, 400, "ref_text")
        assert "ctl" not in [v["id"] for v in httpx.get(srv.url + "/v1/voices", timeout=10).json()["data"]]
    finally:
        srv.stop()


def test_nobody_is_a_proxy_unless_named():
    """uvicorn gets the proxy list explicitly: none by default (it would trust 127.0.0.1), the
    named ones otherwise; a value that is not an address or network is refused at start."""
    from qtts.errors import InputError
    from qtts.server import ServerSettings, create_app
    from qtts.server.runner import _config

    default = _config(create_app(FakeTTS(), ServerSettings()), "warning", False)
    assert default.proxy_headers is False and list(default.forwarded_allow_ips) == []
    named = _config(create_app(FakeTTS(), ServerSettings(forwarded_allow_ips="10.0.0.0/8, ::1")), "warning", False)
    assert named.proxy_headers is True and list(named.forwarded_allow_ips) == ["10.0.0.0/8", "::1"]
    with pytest.raises(InputError, match="forwarded-allow-ips"):
        ServerSettings(forwarded_allow_ips=("proxy.example",))
    from qtts.cli.main import build_parser
    from qtts.cli.serve import _settings

    args = build_parser().parse_args(["serve", "-m", "M", "--forwarded-allow-ips", "127.0.0.1,10.0.0.0/8",
                                      "--forwarded-allow-ips", "::1"])
    assert _settings(args).forwarded_allow_ips == ("127.0.0.1", "10.0.0.0/8", "::1")


def test_a_named_proxy_counts_against_the_total_cap_only():
    """The connection caps count TCP peers: a named proxy carries many clients, so only
    max_connections applies to it; any other address has its per-client share."""
    from types import SimpleNamespace

    from qtts.server import ServerSettings
    from qtts.server.clients import Proxies
    from qtts.server.protocol import over_limit

    settings = ServerSettings(max_connections=8, max_connections_per_client=2)
    conns = [SimpleNamespace(client=("10.0.0.5", 1000 + i)) for i in range(3)]
    assert over_limit(conns, ("10.0.0.5", 1), settings)[0] == "over_client_limit"
    assert over_limit(conns, ("10.0.0.5", 1), settings, Proxies(("10.0.0.0/24",))) is None
    conns += [SimpleNamespace(client=("10.0.0.5", 2000 + i)) for i in range(6)]
    assert over_limit(conns, ("10.0.0.5", 1), settings, Proxies(("10.0.0.0/24",)))[0] == "over_limit"
