"""Attacks on the Wyoming server over loopback TCP (tiny CustomVoice engine): a client that stops
reading, malformed events of every kind, an unknown speaker, idle connections past the cap, and
a Base voice catalog with symlinks; issue 38, against a real ``qtts wyoming`` process: one
address's idle sockets, one client's long requests that it never reads (a good client from
127.0.0.2 is served meanwhile), invisible text; and the frame cap per request. Every read has a
deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from processes import ATTACKER, GOOD, served
from test_wyoming import client, events_until, free_port
from wyoming.tts import Synthesize, SynthesizeVoice

import qtts
from qtts.wyoming import WyomingService, WyomingSettings
from qtts.wyoming.catalog import Catalog, VoiceNotFound

SLACK_S = 10.0
LONG = "This is one long sentence for the stalled client to never read. " * 3


@pytest.fixture(scope="module")
def cv_engine(tiny_snapshot):
    return qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)


async def start(engine, **settings):
    service = WyomingService(engine, WyomingSettings(**{"seed": 1, "max_frames": 6, **settings}))
    port = free_port()
    server = await service.start(f"tcp://127.0.0.1:{port}")
    return service, server, port


def raw_line(event_type: str, data=None) -> bytes:
    header = {"type": event_type, "version": "1.0.0"}
    if data is not None:
        header["data"] = data
    return json.dumps(header).encode() + b"\n"


async def read_one(reader) -> dict | None:
    """The next event (header, data merged; payload skipped), None at the end of the stream."""
    line = await reader.readline()
    if not line:
        return None
    header = json.loads(line)
    if header.get("data_length"):
        header.setdefault("data", {}).update(json.loads(await reader.readexactly(header["data_length"])))
    if header.get("payload_length"):
        await reader.readexactly(header["payload_length"])
    return header


async def raw_exchange(port: int, payload: bytes, deadline: float = SLACK_S, source: str = "127.0.0.1",
                       last: str | None = None) -> tuple[list[dict], bool]:
    """Send ``payload`` on a fresh connection from ``source``; (events the server sent until it closed
    or sent an event of type ``last``, whether it closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(payload)
    await writer.drain()
    events, closed = [], False
    try:
        while not events or events[-1]["type"] != last:
            header = await asyncio.wait_for(read_one(reader), deadline)
            if header is None:
                closed = True
                break
            events.append(header)
    except asyncio.TimeoutError:
        pass
    finally:
        writer.close()
    return events, closed


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def test_a_client_that_stops_reading_holds_nothing(cv_engine):
    """(1) A client with a 4 KiB receive buffer asks for long audio and reads nothing: a good client
    is served before the write deadline passes (the engine is not held while the server waits for
    the reader), and the stalled one is dropped after it."""
    deadline_s = 10.0  # the good client takes ~1 s alone (2026-12-06), a few under a loaded CI

    async def scenario():
        service, server, port = await start(cv_engine, max_frames=30, write_timeout_s=deadline_s)
        server._server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # inherited
        try:
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", port))
            stalled.sendall(raw_line("synthesize", {"text": LONG, "voice": {"name": "ryan"}}))
            for _ in range(200):  # the stalled request started
                if service.generations:
                    break
                await asyncio.sleep(0.05)
            (handler,) = service.connections
            t0 = time.monotonic()
            async with client(f"tcp://127.0.0.1:{port}") as c:
                await c.write_event(Synthesize(text="Still served.").event())
                good = await asyncio.wait_for(events_until(c, "audio-stop"), 60)
            good_s, still_held = time.monotonic() - t0, handler in service.connections
            for _ in range(int((deadline_s + SLACK_S) / 0.05)):
                if handler not in service.connections:
                    break
                await asyncio.sleep(0.05)
            dropped = handler not in service.connections
            stalled.close()
            return good, good_s, still_held, dropped
        finally:
            await server.stop()

    good, good_s, still_held, dropped = run(scenario())
    assert good[-1].type == "audio-stop"
    assert still_held and good_s < deadline_s, (still_held, good_s)  # served while the other is stalled
    assert dropped, "the stalled client was never dropped"


BAD = {
    "not JSON": b"not json\n",
    "a list": b"[1, 2]\n",
    "no type": b'{"data": {}}\n',
    "type not a string": b'{"type": 5}\n',
    "data a list": b'{"type": "synthesize", "data": [1]}\n',
    "text a number": raw_line("synthesize", {"text": 123}),
    "text null": raw_line("synthesize", {"text": None}),
    "no text": raw_line("synthesize", {}),
    "negative data_length": b'{"type": "synthesize", "data_length": -1}\n',
    "data_length a string": b'{"type": "synthesize", "data_length": "5"}\n',
    "data not JSON": b'{"type": "synthesize", "data_length": 5}\nxxxxx',
    "voice a string": raw_line("synthesize", {"text": "hi", "voice": "ryan"}),
    "voice name a number": raw_line("synthesize", {"text": "hi", "voice": {"name": 5}}),
    "chunk text a list": raw_line("synthesize-start", {}) + raw_line("synthesize-chunk", {"text": ["a"]}),
    "a 70 KB line": b'{"type": "' + b"x" * 70_000 + b'"}\n',
    "deep nesting": b'{"type": "synthesize", "data": {"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n",
    "unknown speaker": raw_line("synthesize", {"text": "hi", "voice": {"name": "ryan", "speaker": "nobody"}}),
}


def test_every_malformed_event_gets_the_error_event(cv_engine):
    """(8) Each gets one documented error event (code, text), then the connection closes."""

    async def scenario():
        service, server, port = await start(cv_engine)
        try:
            return {name: await raw_exchange(port, payload) for name, payload in BAD.items()}
        finally:
            await server.stop()

    for name, (events, closed) in run(scenario()).items():
        assert closed and [e["type"] for e in events] == ["error"], (name, events, closed)
        data = events[0]["data"]
        assert data["code"] in ("invalid_event", "invalid_request", "voice_not_found"), (name, data)
        assert "generation failed" not in data["text"], (name, data)
    results = run(scenario())
    assert "string" in results["text a number"][0][0]["data"]["text"]
    assert results["unknown speaker"][0][0]["data"]["code"] == "voice_not_found"


def test_connection_cap_and_idle_timeout(cv_engine):
    """(8) 3 connections allowed: a 4th gets too_many_connections; idle ones are closed after 1 s."""

    async def scenario():
        service, server, port = await start(cv_engine, max_connections=3, idle_timeout_s=1.0)
        try:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            for _ in range(100):
                if len(service.connections) == 3:
                    break
                await asyncio.sleep(0.02)
            extra, extra_closed = await raw_exchange(port, b"", deadline=2.0)
            out = []
            for reader, writer in idle:
                line = await asyncio.wait_for(reader.readline(), 1.0 + SLACK_S)
                out.append(json.loads(line) if line else None)
                writer.close()
            async with client(f"tcp://127.0.0.1:{port}") as c:  # served again afterwards
                await c.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="ryan")).event())
                after = await asyncio.wait_for(events_until(c, "audio-stop"), 60)
            return extra, extra_closed, out, after
        finally:
            await server.stop()

    extra, extra_closed, idle, after = run(scenario())
    assert extra_closed and [e["type"] for e in extra] == ["error"], extra
    assert "too_many_connections" in json.dumps(extra)
    assert all(e is not None and e["type"] == "error" for e in idle), idle
    assert after[-1].type == "audio-stop"


def test_base_catalog_lists_and_reads_regular_files_only(tmp_path):
    """(8) Symlinks in a Base voices folder (inside, outside, dangling) and a directory: not voices."""
    from qtts.voice import Voice

    d, outside = tmp_path / "voices", tmp_path / "elsewhere"
    d.mkdir()
    outside.mkdir()
    Voice(speaker=np.ones(8, np.float32)).save(str(d / "me.voice"))
    Voice(speaker=np.ones(8, np.float32)).save(str(outside / "secret.voice"))
    os.symlink(outside / "secret.voice", d / "leak.voice")
    os.symlink(d / "me.voice", d / "alias.voice")
    os.symlink(d / "nothing.voice", d / "gone.voice")
    os.mkdir(d / "dir.voice")
    cat = Catalog(SimpleNamespace(model_type="base", languages=["auto"]), voices_dir=str(d))
    assert cat.voice_names() == ["me"]
    for name in ("leak", "alias", "gone", "dir"):
        with pytest.raises(VoiceNotFound):
            cat.resolve(name)
    choice = cat.resolve("me")
    assert float(cat.load_voice(choice).speaker[0]) == 1.0
    os.unlink(d / "me.voice")
    os.symlink(outside / "secret.voice", d / "me.voice")  # swapped for a link after it was listed
    with pytest.raises(qtts.errors.InputError):
        cat.load_voice(choice)


# -- issue 38, against a real `qtts wyoming` process (tests/server/processes.py) ----------------------
# Each attack comes from 127.0.0.1, the good client from 127.0.0.2, which measures its first audio
# and must get all of its audio while the attack goes on. Each fails on the commit before the fix
# (b61b060^). The service's flags exist there too, so the failures are the attacks'.
WRITE_TIMEOUT_S = 30.0
PIECE_FRAMES = 40  # --max-frames: the frame budget of one text piece


@pytest.fixture(scope="module")
def wyoming(tiny_snapshot):
    with served("wyoming", tiny_snapshot(kind="custom_voice"), "--seed", "1", "--max-frames",
                str(PIECE_FRAMES), "--write-timeout", str(WRITE_TIMEOUT_S)) as srv:
        yield srv


async def good_audio(port: int, text: str = "Good client.", at_first=None) -> tuple[list[dict], float]:
    """The good client (127.0.0.2): its events up to audio-stop (an error fails the test) and its
    seconds to the first audio-chunk; ``at_first()`` runs when that comes (its result goes to the
    first event as ``at_first``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(GOOD, 0))
    t0, first, events = time.monotonic(), None, []
    try:
        writer.write(raw_line("synthesize", {"text": text}))
        while not events or events[-1]["type"] not in ("audio-stop", "error"):
            event = await asyncio.wait_for(read_one(reader), 120)
            assert event is not None, f"closed after {[e['type'] for e in events][-3:]}"
            events.append(event)
            if first is None and event["type"] == "audio-chunk":
                first = time.monotonic() - t0
                events[0]["at_first"] = at_first() if at_first else None
    finally:
        writer.close()
    assert events[-1]["type"] == "audio-stop" and first is not None, events[-3:]
    return events, first


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (Linux TCP_INFO): 1 established; 8 close-wait (the peer
    closed it), 7 closed (reset)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def stalled_socket(port: int) -> socket.socket:
    """A client on 127.0.0.1 with a 4 KiB receive buffer that will read nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((ATTACKER, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def readable(sock: socket.socket) -> bool:
    """Something has arrived on ``sock`` (left unread)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def wait_until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_one_address_cannot_take_every_connection(wyoming):
    """(4) 16 idle sockets from 127.0.0.1 (the default cap of the whole service): past its
    per-address share (8) they get too_many_connections, and 127.0.0.2 is served while the
    attacker's 8 are held (before the fix: all 16 held, the good client refused)."""

    async def scenario():
        idle = [await asyncio.open_connection("127.0.0.1", wyoming.port, local_addr=(ATTACKER, 0)) for _ in range(16)]
        try:
            async def refused(reader) -> bool:
                with contextlib.suppress(asyncio.TimeoutError):
                    event = await asyncio.wait_for(read_one(reader), 1.0)
                    return (event or {}).get("data", {}).get("code") == "too_many_connections"
                return False

            answers = await asyncio.gather(*(refused(reader) for reader, _ in idle))
            return sum(answers), await good_audio(wyoming.port)
        finally:
            for _, writer in idle:
                writer.close()

    refused, (good, first_s) = run(scenario())
    assert refused == 8, refused
    assert any(e["type"] == "audio-chunk" for e in good), first_s


class Listener(threading.Thread):
    """A Wyoming client that reads everything it is sent; ``frames``: audio frames received so far."""

    def __init__(self, sock: socket.socket):
        super().__init__(daemon=True)
        self.sock, self.frames, self.end = sock, 0, None

    def run(self) -> None:
        with contextlib.suppress(OSError), self.sock.makefile("rb") as f:
            while line := f.readline():
                event = json.loads(line)
                f.read(event.get("data_length") or 0)
                self.frames += len(f.read(event.get("payload_length") or 0)) // (2 * 1920)
                if event["type"] in ("error", "audio-stop"):
                    self.end = event["type"]


def test_long_requests_of_one_client_do_not_hold_the_engine(wyoming):
    """(5) 127.0.0.1 sends three synthesize events of 4,096 characters on a connection it never
    reads, and three more on one it reads (the listener: each request is about 20 pieces of at most
    PIECE_FRAMES frames). The good client starts when the listener hears its audio, and by the good
    client's first audio the listener got at most two more pieces: the engine went to the good
    client after the piece it was speaking (before the fix: after the listener's whole request,
    hundreds of frames). The stalled connection is still open."""
    long = raw_line("synthesize", {"text": ("A long sentence that nobody will ever hear from this server. " * 70)[:4096]})
    stalled = stalled_socket(wyoming.port)
    listener = Listener(socket.create_connection(("127.0.0.1", wyoming.port), source_address=(ATTACKER, 0)))
    try:
        stalled.sendall(long * 3)
        assert wait_until(lambda: readable(stalled), 60), "the stalled client's audio never started"
        listener.start()
        listener.sock.sendall(long * 3)
        assert wait_until(lambda: listener.frames > 0, 120), "the listener's audio never started"
        before = listener.frames
        good, _ = run(good_audio(wyoming.port, at_first=lambda: listener.frames))
        heard = good[0]["at_first"] - before
        assert heard <= 2 * PIECE_FRAMES, f"the listener got {heard} frames before the good client's first audio"
        assert listener.end is None and tcp_state(stalled) == 1  # the attack is still going on
    finally:
        stalled.close()
        listener.sock.close()


def test_invisible_text_is_empty(wyoming):
    """(issue 38) Text of only format or control characters is refused as empty, as on every surface."""

    async def scenario():
        return [await raw_exchange(wyoming.port, raw_line("synthesize", {"text": t})) for t in ("\u200b\u2060", "\x01")]

    for events, closed in run(scenario()):
        assert closed and [e["type"] for e in events] == ["error"] and "empty" in events[0]["data"]["text"], events


def test_a_request_has_one_frame_cap_in_all(cv_engine):
    """(issue 38) The frame cap holds for a whole request, however many sentences it has; by
    default it is the HTTP server's."""
    from qtts.server import ServerSettings

    assert WyomingSettings().max_request_frames == ServerSettings().max_frames

    async def scenario():
        service, server, port = await start(cv_engine, max_frames=None, max_request_frames=6)
        try:
            text = " ".join(f"Sentence number {i} is here." for i in range(40))
            events, _ = await raw_exchange(port, raw_line("synthesize", {"text": text}), 60.0, last="audio-stop")
            return events
        finally:
            await server.stop()

    events = run(scenario())
    samples = sum(e["payload_length"] // 2 for e in events if e["type"] == "audio-chunk")
    assert events[-1]["type"] == "audio-stop" and 0 < samples <= 6 * 1920, samples
