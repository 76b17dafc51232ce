"""Attacks on WebSocket /v1/audio/speech/stream against a real uvicorn on 127.0.0.1 (tiny
CustomVoice engine): a client that stops reading, one that keeps a worker with empty messages,
message and ping floods, many sockets from one address, sessions past --max-frames, deep JSON
and a huge voice name. Every loop and socket read is bounded; deadlines are the configured
limit plus generous slack."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import qtts
from support import ws_raw
from support.server_util import assert_healthy, metric, start_server, wait_for

SESSION = {"voice": "vivian", "response_format": "pcm", "greedy": True}
SLACK_S = 10.0
LONG = "Hello there, this is a fairly long sentence with many words to speak. " * 6


@pytest.fixture(scope="module")
def engine(tiny_snapshot):
    return qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)


@pytest.fixture()
def server(engine, request):
    settings = dict(max_frames=64, ws_idle_timeout_s=1.0, write_timeout_s=1.0, max_queue=2)
    settings.update(getattr(request, "param", {}))
    srv, _ = start_server(engine, **settings)
    srv.ws = srv.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    yield srv
    srv.stop()


def session(url: str, messages, every_s: float = 0.0, read_s: float = 60.0):
    """Send ``messages`` (pausing ``every_s``), then read; (audio bytes, events, close code)."""
    audio, events = b"", []
    with connect(url, max_size=None) as ws:
        try:
            for m in messages:
                ws.send(json.dumps(m) if isinstance(m, dict) else m)
                if every_s:
                    time.sleep(every_s)
        except ConnectionClosed:
            pass
        end = time.monotonic() + read_s
        try:
            while time.monotonic() < end:
                msg = ws.recv(timeout=max(0.1, end - time.monotonic()))
                if isinstance(msg, bytes):
                    audio += msg
                else:
                    events.append(json.loads(msg))
        except (ConnectionClosed, TimeoutError):
            pass
        return audio, events, ws.close_code


def codes(events) -> list[str]:
    return [e["error"]["code"] for e in events if e["type"] == "error"]


def open_connections(srv) -> int:
    return len(srv.server.server_state.connections)


def test_empty_and_unknown_messages_do_not_keep_a_session(server):
    """(2) session.update, then "" deltas and unknown types every 0.2 s: closed at the idle limit."""
    msgs = [{"type": "session.update", "session": SESSION}]
    msgs += [{"type": "text.delta", "delta": ""}, {"type": "nope"}, {"type": "text.delta", "delta": "  "}] * 50
    t0 = time.monotonic()  # 30 s of messages, unless the server closes first
    _, events, code = session(server.ws, msgs, every_s=0.2, read_s=SLACK_S)
    assert code == 1008 and "idle_timeout" in codes(events), (code, codes(events))
    assert time.monotonic() - t0 < 1.0 + SLACK_S / 2, time.monotonic() - t0
    assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0)


def test_real_text_keeps_the_session_and_is_spoken(server):
    msgs = [{"type": "session.update", "session": SESSION}]
    msgs += [{"type": "text.delta", "delta": w + " "} for w in "one two three four".split()] + [{"type": "text.done"}]
    audio, events, code = session(server.ws, msgs, every_s=0.4)
    assert code == 1000 and events[-1]["type"] == "audio.done" and audio


@pytest.mark.parametrize("server", [{"ws_max_messages_per_s": 20.0}], indirect=True)
def test_a_message_flood_is_closed(server):
    """(2) 400 messages at once against a limit of 20 per second (bursts of 40)."""
    msgs = [{"type": "nope"}] * 400
    _, events, code = session(server.ws, msgs, read_s=SLACK_S)
    assert code == 1008 and codes(events)[-1] == "too_many_messages", (code, codes(events)[-3:])
    assert codes(events).count("unknown_type") <= 41


@pytest.mark.parametrize("server", [{"max_connections_per_client": 4, "ws_idle_timeout_s": 60.0,
                                     "ws_max_sessions_per_client": 8}], indirect=True)
def test_connections_per_client_address_are_capped(server):
    """(2) 4 sockets from 127.0.0.1 (idle WebSockets and a silent TCP connection) fill its share."""
    held = [connect(server.ws) for _ in range(3)] + [socket.create_connection((server.host, server.port))]
    try:
        extra = socket.create_connection((server.host, server.port))  # sends nothing: no reset hides the answer
        extra.settimeout(SLACK_S)
        answer = extra.recv(4096)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"per client" in answer, answer
    finally:
        for h in held:
            h.close()
    assert wait_for(lambda: open_connections(server) == 0, SLACK_S)
    assert_healthy(server.url)
    assert metric(server.url, "qtts_connections_closed_total", reason="over_client_limit") >= 1


def _flood_pings(sock, seconds: float) -> bool:
    """Send pings (125-byte payloads) as fast as the socket takes them; True when the server cut it."""
    ping = ws_raw.frame(ws_raw.OP_PING, b"p" * 125) * 64
    sock.settimeout(0.5)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            sock.sendall(ping)
        except TimeoutError:
            continue  # the server stopped reading (backpressure)
        except OSError:
            return True
    return False


def test_a_ping_flood_is_closed_and_does_not_grow_memory(server):
    """(4) A client with a 4 KiB receive buffer floods pings and reads nothing."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        sock, head = ws_raw.connect(server.host, server.port, rcvbuf=4096)
        assert b" 101 " in head, head
        sock.sendall(ws_raw.text({"type": "session.update", "session": SESSION}))
        _flood_pings(sock, 3.0)
        data, closed = ws_raw.read_until_closed(sock, SLACK_S)
        sock.close()
        assert closed, "the flooding socket was never closed"
        # closed with 1008 at the 11th ping (the close frame may sit behind unread pongs, which the
        # write deadline then discards)
        assert metric(server.url, "qtts_connections_closed_total", reason="ws_ping_flood") == 1
        assert ws_raw.close_code(data) in (1008, None)
        assert wait_for(lambda: open_connections(server) == 0, SLACK_S)
        assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert not [r for r in records if "Exception in ASGI application" in r.getMessage()]
    assert_healthy(server.url)


def test_a_client_that_stops_reading_is_dropped(server):
    """(1) Audio for a client that reads nothing (4 KiB buffers both ends): aborted after the write
    deadline; the worker is free and others are served."""
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # accepted sockets inherit it
    sock, head = ws_raw.connect(server.host, server.port, rcvbuf=4096)
    assert b" 101 " in head
    sock.sendall(ws_raw.text({"type": "session.update", "session": dict(SESSION, chunk_events=True)})
                 + ws_raw.text({"type": "text.delta", "delta": LONG}) + ws_raw.text({"type": "text.done"}))
    try:
        assert wait_for(lambda: metric(server.url, "qtts_connections_closed_total", reason="write_timeout") >= 1,
                        60.0), "the stalled reader was never dropped"
        assert wait_for(lambda: open_connections(server) == 0, SLACK_S)  # aborted, not left flushing
        assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0)
    finally:
        sock.close()
    _, events, code = session(server.ws, [{"type": "session.update", "session": SESSION},
                                          {"type": "text.delta", "delta": "Hi."}, {"type": "text.done"}])
    assert code == 1000


@pytest.mark.parametrize("server", [{"max_frames": 16}], indirect=True)
def test_max_frames_caps_the_whole_session(server):
    """(5) --max-frames 16: a long text stops at 16 frames; a session's max_frames=4 at 4."""
    done = {"type": "text.done"}
    for cfg, cap in ((SESSION, 16), (dict(SESSION, max_frames=4), 4)):
        msgs = [{"type": "session.update", "session": cfg}, {"type": "text.delta", "delta": LONG}, done]
        audio, events, code = session(server.ws, msgs)
        stats = events[-1]
        assert code == 1000 and stats["type"] == "audio.done", events[-2:]
        assert stats["stats"]["frames"] <= cap and stats["finish_reason"] == "length", stats
        assert len(audio) <= cap * 1920 * 2
    msgs = [{"type": "session.update", "session": dict(SESSION, max_frames=4)}]
    msgs += [{"type": "text.delta", "delta": "a. "}] * 300 + [done]  # many talker contexts
    audio, events, code = session(server.ws, msgs)
    assert code == 1000 and events[-1]["stats"]["frames"] <= 4 and len(audio) <= 4 * 1920 * 2


def test_deep_json_and_a_huge_voice_are_bad_input(server):
    """(8) 5,000 nested lists: an invalid_json error, not a RecursionError; a 20,000-character voice name:
    refused like HTTP's (256 characters) without echoing it."""
    deep = '{"type": "text.delta", "delta": ' + "[" * 5000 + "]" * 5000 + "}"
    msgs = [{"type": "session.update", "session": SESSION}, deep, {"type": "text.delta", "delta": "Hi."},
            {"type": "text.done"}]
    _, events, code = session(server.ws, msgs)
    assert codes(events) == ["invalid_json"] and code == 1000, (codes(events), code)
    _, events, code = session(server.ws, [{"type": "session.update", "session": dict(SESSION, voice="v" * 20_000)}])
    assert code == 1008 and codes(events) == ["invalid_session"]
    message = events[0]["error"]["message"]
    assert "256" in message and len(message) < 500, message[:300]
