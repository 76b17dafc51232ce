"""Hardening, round 2 (issue 38), against a real uvicorn on 127.0.0.1 (tiny CustomVoice engine, one
worker slot), with a good client from 127.0.0.2 timing its first audio: a FLAC client that hangs
up frees the slot (cancel counted); X-Forwarded-For from an address that is not a named proxy buys
neither WebSocket sessions nor queue places; Content-Length with Transfer-Encoding is a 400 and a
closed connection; one rule for empty text; a Host with userinfo is refused; a client over the
connection cap reads its 503. Every wait is bounded; the checks are causal (what was served, what
was counted), never timings."""

from __future__ import annotations

import contextlib
import io
import json
import socket

import httpx
import pytest
from test_fair_share import BODY, Request, engine, gate, send  # noqa: F401 (fixtures)
from test_harden_capacity import SESSION, _closed_with, _connect_from
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.server_fakes import FakeTTS
from support.server_util import assert_error, assert_healthy, metric, start_server, wait_for, wav_bytes

LONG = "This sentence goes on and on for a client that hangs up at once. " * 12
FRAMES = "qtts_frames_generated_total"
CANCELLED = "qtts_requests_cancelled_total"


@pytest.fixture()
def server(engine, gate, request):  # noqa: F811
    srv, _ = start_server(engine, capacity=1, max_queue=4, **getattr(request, "param", {}))
    srv.ws = srv.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    yield srv
    gate.set()
    srv.stop()


def raw(srv, data: bytes, source: str = "127.0.0.1") -> socket.socket:
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


def good_first_audio(srv) -> Request:
    good = Request(srv.url, "127.0.0.2", "good")
    good.run()
    assert good.status == 200 and good.first, good.status
    return good


@pytest.mark.parametrize("fmt,stream", [("flac", "audio"), ("flac", "sse"), ("mp3", "sse"), ("pcm", "audio")])
def test_a_client_that_hangs_up_frees_the_slot(server, fmt, stream):
    """(1) A request for 600 frames whose client hangs up once generation started: the next
    client (127.0.0.2) is served, the cancel is counted, and the hung-up request stopped long
    before its budget (FLAC sends nothing before the end, so only a watched disconnect stops it)."""
    frames0, cancelled0 = metric(server.url, FRAMES), metric(server.url, CANCELLED)
    sock = raw(server, post({**BODY, "input": LONG, "response_format": fmt, "stream_format": stream,
                             "max_frames": 600}))
    assert wait_for(lambda: metric(server.url, FRAMES) > frames0, 60)
    sock.close()
    good_first_audio(server)
    assert wait_for(lambda: metric(server.url, CANCELLED) == cancelled0 + 1, 30), "the hang-up was not counted"
    assert metric(server.url, FRAMES) - frames0 - BODY["max_frames"] < 300  # it ran on to 600 before
    assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0)


def test_forwarded_for_from_a_client_buys_no_sessions(server):
    """(2) Five sessions from 127.0.0.1, each with its own X-Forwarded-For: still one client, so
    three are closed with 1013 too_many_sessions; 127.0.0.2 gets its session and its audio."""
    held = [connect(server.ws, additional_headers={"X-Forwarded-For": f"10.9.0.{i}"}) for i in range(5)]
    try:
        for h in held:
            with contextlib.suppress(ConnectionClosed):  # (a refused one is closed at once)
                h.send(json.dumps({"type": "session.update", "session": SESSION}))
        refused = [h for h in held[2:] if _closed_with(h) == (1013, ["too_many_sessions"])]
        assert len(refused) == 3 and metric(server.url, "qtts_live_sessions") == 2
        with _connect_from(server.ws, "127.0.0.2") as good:
            for m in ({"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": "Hi."},
                      {"type": "text.done"}):
                good.send(json.dumps(m))
            assert isinstance(good.recv(timeout=60), (bytes, str))
            assert _closed_with(good) == (1000, [])
    finally:
        for h in held:
            h.close()
    assert_healthy(server.url)


def test_forwarded_for_from_a_client_buys_no_queue_places(server, gate):  # noqa: F811
    """(2) 127.0.0.1 holds the slot and fills the queue, each request with its own
    X-Forwarded-For: 127.0.0.2 still takes the place of its newest waiter and is served next."""
    gate.clear()
    a = []
    for i in range(5):
        a.append(send(server, "127.0.0.1", f"a{i}", i, headers={"X-Forwarded-For": f"10.9.1.{i}"}))
    b = send(server, "127.0.0.2", "b0", 4)
    assert wait_for(lambda: a[4].status is not None, 30) and a[4].status == 429
    gate.set()
    for r in a + [b]:
        r.join(120)
    assert b.status == 200 and [r.status for r in a[:4]] == [200] * 4
    order = [r.name for r in sorted(a[:4] + [b], key=lambda r: r.first)]
    assert order[:2] == ["a0", "b0"], order


@pytest.mark.parametrize("server", [{"forwarded_allow_ips": ("127.0.0.1",)}], indirect=True)
def test_a_named_proxy_forwards_its_clients(server):
    """(2) With 127.0.0.1 named a proxy, the addresses it forwards are the clients: three sessions
    through it, each for its own client, are all live."""
    held = [connect(server.ws, additional_headers={"X-Forwarded-For": f"10.9.2.{i}"}) for i in range(3)]
    try:
        for h in held:
            h.send(json.dumps({"type": "session.update", "session": SESSION}))
        assert wait_for(lambda: metric(server.url, "qtts_live_sessions") == 3)
    finally:
        for h in held:
            h.close()
    assert wait_for(lambda: metric(server.url, "qtts_live_sessions") == 0)


def test_content_length_with_transfer_encoding_closes_the_connection(server):
    """(4) RFC 9112 6.1: answered 400, then closed; the request behind it is not answered."""
    smuggled = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = read_all(raw(server, smuggled))
    assert data.startswith(b"HTTP/1.1 400 ") and data.count(b"HTTP/1.1 ") == 1, data[:400]
    good_first_audio(server)


INVISIBLE = ["\u200b\u200d\u2060", "\ufeff", "\x01\x02\x1b", "\u00ad \u200e\t"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_invisible_text_is_empty_over_http_and_the_websocket(server, text):
    """(4) Text of only format or control characters is empty: 400 over HTTP, the same error on
    the WebSocket, the engine's own check (Wyoming uses it) and ``qtts say`` (exit 2)."""
    from qtts.errors import InputError
    from qtts.text.prompt import clean_text

    r = httpx.post(server.url + "/v1/audio/speech", json={**BODY, "input": text}, timeout=30)
    assert_error(r, 400, "empty")
    with connect(server.ws) as ws:
        for m in ({"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": text},
                  {"type": "text.done"}):
            ws.send(json.dumps(m))
        code, errors = _closed_with(ws)
    assert errors == ["invalid_value"], (code, errors)
    with pytest.raises(InputError, match="empty"):
        clean_text(text)
    from qtts.cli.main import main

    assert main(["say", text, "-m", "/nonexistent/model", "-o", "/nonexistent/x.wav"]) == 2  # before the model
    good_first_audio(server)


def test_a_control_only_ref_text_is_refused(tmp_path):
    """(4) As docs/server.md says: an upload whose ref_text has nothing to speak is a 400."""
    srv, _ = start_server(FakeTTS(), voices_dir=str(tmp_path))
    try:
        for ref_text in ("\u200b\u2060", "\x01\x02"):
            r = httpx.post(srv.url + "/v1/voices", files={"file": ("a.wav", io.BytesIO(wav_bytes()), "audio/wav")},
                           data={"ref_text": ref_text, "name": "ctl"}, timeout=30)
            assert_error(r, 400, "ref_text")
        assert "ctl" not in [v["id"] for v in httpx.get(srv.url + "/v1/voices", timeout=10).json()["data"]]
    finally:
        srv.stop()


@pytest.mark.parametrize("host", ["127.0.0.1:{port}@evil.example", "user@127.0.0.1:{port}", "127.0.0.1:x{port}"])
def test_a_host_with_userinfo_is_refused(server, host):
    """(4) The Host header names this server, nothing more: userinfo or a port that is not one is 403."""
    r = httpx.get(server.url + "/health", headers={"Host": host.format(port=server.port)}, timeout=10)
    assert_error(r, 403, "host")


@pytest.mark.parametrize("server", [{"max_connections_per_client": 2}], indirect=True)
def test_a_client_over_the_connection_cap_reads_its_503(server):
    """(4) Two connections held from 127.0.0.1 (its cap): a third that sends its request at once, a
    small one or a 1 MB upload, sends it all and reads the 503 to a clean end (no TCP reset, no
    broken pipe), every time; 127.0.0.2 is served meanwhile."""
    held = [raw(server, b"") for _ in range(2)]
    try:
        for size in (100, 1_000_000):
            for _ in range(5):
                sock = raw(server, post({**BODY, "input": "x" * size}))  # sendall: no BrokenPipeError
                data = b""
                while chunk := sock.recv(65536):  # to EOF: no ConnectionResetError
                    data += chunk
                sock.close()
                assert data.startswith(b"HTTP/1.1 503 ") and b"too many open connections" in data, data[:200]
        good_first_audio(server)
    finally:
        for s in held:
            s.close()


def test_nobody_is_a_proxy_unless_named():
    """(2) uvicorn gets the proxy list explicitly: none by default (it would trust 127.0.0.1), the
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
    """(2) The connection caps count TCP peers: a named proxy carries many clients, so only
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
