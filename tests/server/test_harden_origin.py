"""(7) The origin policy against a real uvicorn on 127.0.0.1 (fake engine): browsers from other
origins and Host names that do not name the server are refused (403, the WebSocket handshake
too); the server's own page, allowed origins/hosts and clients without Origin keep working.
(8) API JSON carries nosniff."""

from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from qtts.errors import InputError
from qtts.server import ServerSettings
from support import ws_raw
from support.server_fakes import FakeTTS
from support.server_util import assert_error, start_server, wait_for, wav_bytes

EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server, _ = start_server(FakeTTS(), voices_dir=str(tmp_path_factory.mktemp("voices")),
                             allow_origins=("https://app.example.com",), allow_hosts=("tts.example.com",))
    server.ws = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    yield server
    server.stop()


def ws_status(url: str, **headers) -> int:
    """101 when the handshake succeeds, else the HTTP status it was refused with."""
    try:
        with connect(url, additional_headers=headers, open_timeout=10):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def upload(srv, **headers) -> httpx.Response:
    return httpx.post(srv.url + "/v1/voices", files={"file": ("a.wav", wav_bytes(), "audio/wav")}, headers=headers,
                      timeout=30)


def speak(srv, **headers) -> httpx.Response:
    return httpx.post(srv.url + "/v1/audio/speech", json={"input": "hi", "response_format": "pcm"},
                      headers=headers, timeout=30)


def test_websocket_from_another_origin_is_refused(srv):
    assert ws_status(srv.ws, Origin=EVIL) == 403
    assert ws_status(srv.ws, Origin="null") == 403
    assert ws_status(srv.ws) == 101  # no Origin: not a browser
    assert ws_status(srv.ws, Origin=srv.url) == 101  # the server's own page
    assert ws_status(srv.ws.replace("127.0.0.1", "localhost"), Origin=f"http://localhost:{srv.port}") == 101
    assert ws_status(srv.ws, Origin="https://app.example.com") == 101  # --allow-origin


def test_state_changing_requests_from_another_origin_are_refused(srv):
    assert_error(upload(srv, Origin=EVIL), 403, "--allow-origin")  # a CORS "simple request"
    assert_error(speak(srv, Origin=EVIL), 403, "evil.example")
    assert_error(httpx.delete(srv.url + "/v1/voices/x", headers={"Origin": EVIL}), 403, "origin")
    assert upload(srv).status_code == 201  # curl, the openai client: no Origin
    assert speak(srv, Origin=srv.url).status_code == 200
    assert speak(srv, Origin="https://app.example.com").status_code == 200
    assert httpx.get(srv.url + "/v1/models", headers={"Origin": EVIL}).status_code == 200  # unreadable to it


def test_host_must_name_the_server(srv):
    r = httpx.get(srv.url + "/health", headers={"Host": "evil.example"})
    err = assert_error(r, 403, "--allow-host")
    assert err["code"] == "forbidden_host"
    sock, head = ws_raw.connect(srv.host, srv.port, host_header="evil.example")
    sock.close()
    assert head.startswith(b"HTTP/1.1 403"), head
    for host in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", "tts.example.com", "app.localhost:1"):
        assert httpx.get(srv.url + "/health", headers={"Host": host}).status_code == 200, host


def test_wildcard_bind_and_allow_lists(tmp_path):
    from qtts.server.origin import OriginPolicy

    policy = OriginPolicy(ServerSettings(host="0.0.0.0"))
    assert policy.host_ok("192.168.1.20:8000") and policy.host_ok("[fe80::1]:8000")
    assert not policy.host_ok("evil.example:8000")
    assert OriginPolicy(ServerSettings(allow_hosts=("*",), allow_origins=("*",))).origin_ok(EVIL, "x")
    for bad in ({"allow_origins": ("evil.example",)}, {"allow_origins": ("http://a/b",)},
                {"allow_hosts": ("a/b",)}):
        with pytest.raises(InputError, match="--allow-"):
            ServerSettings(**bad)
    assert ServerSettings(allow_hosts="a.example, b.example").allow_hosts == ("a.example", "b.example")


def test_api_json_is_nosniff(srv):
    for r in (httpx.get(srv.url + "/v1/models"), httpx.get(srv.url + "/nope"), speak(srv)):
        assert r.headers["x-content-type-options"] == "nosniff", r.url


def test_closed_websockets_are_freed_at_once(srv):
    """A finished session scheduled a write-deadline timer that kept its protocol (and every message
    queued in it) alive for write_timeout + close_timeout seconds after the client had gone: under a
    connection churn that is a thousand dead connections held (benchmarks/soak.py --tracemalloc). Now the
    timer is cancelled when the connection is lost."""
    import gc
    import json as _json

    from qtts.server.protocol import GuardedWebSocketProtocol

    def live() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if issubclass(type(o), GuardedWebSocketProtocol) and o.disconnected)

    before = live()
    for _ in range(20):
        with connect(srv.ws, open_timeout=10) as ws:
            ws.send(_json.dumps({"type": "nonsense"}))
            ws.recv(timeout=10)
    assert wait_for(lambda: live() <= before, 5.0), f"{live() - before} closed WebSocket protocols still held"
