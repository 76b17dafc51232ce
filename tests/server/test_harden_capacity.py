"""Live sessions and capacity (issue 26, the soak at capacity) against a real uvicorn on 127.0.0.1
(tiny CustomVoice engine, one worker slot): a session holds the worker only while an utterance
speaks, a trickling or steadily talking session yields it to a waiting HTTP request, a later
utterance is admitted (or refused) like any request, and one address opens at most
``ws_max_sessions_per_client`` sessions. Every loop and read is bounded; the deadlines are
generous (a request alone, times five, plus 30 s) and the causal check is that the HTTP request
finished while the session was still talking (today's main: only once the session ended)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import qtts
from qtts.engine.synth import Synthesis
from qtts.server import worker
from qtts.server.metrics import ServerMetrics
from qtts.server.worker import Scheduler
from support.server_util import GatedBackend, assert_healthy, metric, start_server, wait_for

SESSION = {"voice": "vivian", "response_format": "pcm", "greedy": True}
BODY = {"input": "Hello there, how are you?", "voice": "vivian", "response_format": "pcm", "max_frames": 16}
CONTEXT_FRAMES = 24
DEADLINE_S = 30.0  # for one good request while a session talks (+ 5 x the request alone)


@pytest.fixture(scope="module")
def gate():
    g = threading.Event()
    g.set()
    return g


class ShortContexts(Synthesis):
    """Random weights seldom emit EOS, so a talker context whose text ended would go on to its
    budget (40 + 8 per text token frames); here every context stops after CONTEXT_FRAMES, as a
    real model stops soon after its text (the next text goes on in a new context)."""

    def loop_params(self, max_frames, options, index, cancel=None):
        lp = super().loop_params(max_frames, options, index, cancel)
        return dataclasses.replace(lp, max_frames=min(lp.max_frames, CONTEXT_FRAMES))


@pytest.fixture(scope="module")
def engine(tiny_snapshot, gate):
    tts = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
    out = qtts.TTS(dataclasses.replace(tts.components, backend=GatedBackend(tts.components.backend, gate)))
    out.synth = ShortContexts(out.components)
    return out


@pytest.fixture()
def server(engine, gate, request):
    settings = dict(capacity=1, max_queue=4, ws_idle_timeout_s=60.0)
    settings.update(getattr(request, "param", {}))
    srv, _ = start_server(engine, **settings)
    srv.ws = srv.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    yield srv
    gate.set()
    srv.stop()


class Talker(threading.Thread):
    """A WebSocket session that sends ``pieces`` every ``every_s`` (cycling) until ``stop`` or
    ``limit_s``, reading all the while; then text.done and the rest of its answer."""

    def __init__(self, url: str, pieces: list[str], every_s: float, limit_s: float = 600.0, session=None):
        super().__init__(daemon=True)
        self.url, self.pieces, self.every_s, self.limit_s = url, pieces, every_s, limit_s
        self.session = session or SESSION
        self.stop, self.talking = threading.Event(), threading.Event()
        self.audio, self.events, self.close_code, self.open = 0, [], None, True

    def run(self) -> None:
        with connect(self.url, max_size=None) as ws:
            reader = threading.Thread(target=self._read, args=(ws,), daemon=True)
            reader.start()
            ws.send(json.dumps({"type": "session.update", "session": self.session}))
            end, i = time.monotonic() + self.limit_s, 0
            try:
                while not self.stop.is_set() and time.monotonic() < end:
                    ws.send(json.dumps({"type": "text.delta", "delta": self.pieces[i % len(self.pieces)]}))
                    i += 1
                    self.stop.wait(self.every_s)
                ws.send(json.dumps({"type": "text.done"}))
            except ConnectionClosed:
                pass
            reader.join(120)
            self.close_code = ws.close_code
        self.open = False

    def _read(self, ws) -> None:
        try:
            while True:
                msg = ws.recv(timeout=120)
                if isinstance(msg, bytes):
                    self.audio += len(msg)
                    self.talking.set()
                else:
                    self.events.append(json.loads(msg))
        except (ConnectionClosed, TimeoutError):
            pass


def events_until_closed(ws) -> list:
    """Every JSON event the server sends until it closes the socket (60 s per message at most)."""
    events = []
    try:
        while True:
            msg = ws.recv(timeout=60)
            if isinstance(msg, str):
                events.append(json.loads(msg))
    except ConnectionClosed:
        pass
    return events


def good_request(url: str, timeout: float = 120.0) -> tuple[float, float, int | None]:
    """(seconds to the first audio byte, to the end, status; None: no answer within ``timeout``)
    of one streamed HTTP request."""
    t0, first = time.monotonic(), None
    try:
        with httpx.stream("POST", url + "/v1/audio/speech", json=BODY, timeout=timeout) as r:
            for _ in r.iter_raw():
                first = first or time.monotonic() - t0
            status = r.status_code
    except httpx.TimeoutException:
        status = None
    end = time.monotonic() - t0
    return first or end, end, status


def gauges_at_zero(srv) -> bool:
    return all(metric(srv.url, m) == 0 for m in ("qtts_in_flight", "qtts_queue_depth", "qtts_live_sessions"))


def good_requests_while(srv, talker: Talker, n: int) -> list[float]:
    """``n`` good requests while ``talker`` talks (after one alone, for the deadline); each must
    finish in time while the talker is still open, and the talker, still talking, must get audio
    again after the last of them (it goes on being served). Their seconds to first audio."""
    _, alone, status = good_request(srv.url)
    assert status == 200
    deadline = DEADLINE_S + 5 * alone
    talker.start()
    waits = []
    try:
        assert talker.talking.wait(60) and wait_for(lambda: metric(srv.url, "qtts_in_flight") == 1)
        for _ in range(n):
            first, end, status = good_request(srv.url, timeout=deadline)
            assert status == 200 and talker.open and end < deadline, (status, talker.open, end, alone)
            waits.append(first)
        heard = talker.audio
        assert wait_for(lambda: talker.audio > heard, deadline) and talker.open, (heard, talker.events[-1:])
    finally:
        talker.stop.set()
        talker.join(120)
    return waits


def test_a_trickling_session_does_not_hold_the_only_worker(server):
    """A session that keeps itself alive with one word every 0.4 s (its talker waits for text
    almost all the time) gives the only worker to a waiting HTTP request within about one
    utterance gap (1 s), and goes on being served after it."""
    talker = Talker(server.ws, ["a "], every_s=0.4)
    good_requests_while(server, talker, n=2)
    assert talker.close_code == 1000 and talker.audio > 0, (talker.close_code, talker.events[-1:])
    done = talker.events[-1]
    # it yielded to the first request and was served again after the second (good_requests_while);
    # the second request may take the slot before the session's next utterance is admitted (it was
    # queued when the first one's slot came free: a later utterance goes after new requests), so
    # two utterances, not three, are enough (a CI run under a loaded suite saw that order)
    assert done["type"] == "audio.done" and done["stats"]["utterances"] >= 2, done
    assert wait_for(lambda: gauges_at_zero(server))


@pytest.mark.parametrize("server", [{"ws_utterance_gap_s": 60.0}], indirect=True)
def test_a_talking_session_yields_at_a_sentence_end(server):
    """With the pause and wait rules out of reach (a 60 s gap), a session that talks without a
    pause ends its utterance at the next sentence end once an HTTP request waits."""
    words = "One two three four five. Six seven eight nine ten. ".split(" ")
    talker = Talker(server.ws, [w + " " for w in words if w], every_s=0.4)
    good_requests_while(server, talker, n=2)
    # each request that arrives while the session speaks splits it; one that arrives between two of
    # its utterances (seen under a loaded full suite) is served without a split: at least one split
    assert talker.close_code == 1000 and talker.events[-1]["stats"]["utterances"] >= 2, talker.events[-1:]
    assert wait_for(lambda: gauges_at_zero(server))


def test_a_session_between_utterances_holds_no_worker(server):
    """One utterance, then the session stays open and silent: the worker is free (an HTTP request
    takes it at once); new text is a second utterance in the same answer."""
    with connect(server.ws, max_size=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": SESSION}))
        ws.send(json.dumps({"type": "text.delta", "delta": "Hello there."}))
        assert isinstance(next(m for m in iter(lambda: ws.recv(timeout=60), None) if isinstance(m, bytes)), bytes)
        assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0, DEADLINE_S)
        assert metric(server.url, "qtts_live_sessions") == 1
        assert good_request(server.url)[2] == 200
        ws.send(json.dumps({"type": "text.delta", "delta": " And one more thing."}))
        ws.send(json.dumps({"type": "text.done"}))
        events = events_until_closed(ws)
        assert ws.close_code == 1000 and events[-1]["type"] == "audio.done", events[-1:]
        assert events[-1]["stats"]["utterances"] == 2
    assert wait_for(lambda: gauges_at_zero(server))


@pytest.mark.parametrize("server", [{"max_queue": 0}], indirect=True)
def test_a_later_utterance_is_refused_when_the_queue_is_full(server, gate):
    with connect(server.ws, max_size=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": SESSION}))
        ws.send(json.dumps({"type": "text.delta", "delta": "Hello there."}))
        assert wait_for(lambda: metric(server.url, "qtts_audio_seconds_total") > 0, DEADLINE_S)
        assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0, DEADLINE_S)
        gate.clear()  # the HTTP request holds the worker at its first frame
        result = {}
        held = threading.Thread(target=lambda: result.update(r=good_request(server.url)), daemon=True)
        held.start()
        assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 1)
        ws.send(json.dumps({"type": "text.delta", "delta": " More text."}))
        events = events_until_closed(ws)
        errors = [e["error"]["code"] for e in events if e["type"] == "error"]
        assert ws.close_code == 1013 and errors == ["queue_full"], (ws.close_code, events)
    gate.set()
    held.join(60)
    assert result["r"][2] == 200
    assert wait_for(lambda: gauges_at_zero(server))


def _connect_from(url: str, address: str):
    host, port = url.split("//")[1].split("/")[0].split(":")
    sock = socket.socket()
    sock.bind((address, 0))
    sock.connect((host, int(port)))
    return connect(url, sock=sock, max_size=None)


def _closed_with(ws) -> tuple[int | None, list[str]]:
    codes = []
    try:
        while True:
            msg = ws.recv(timeout=30)
            if isinstance(msg, str) and json.loads(msg)["type"] == "error":
                codes.append(json.loads(msg)["error"]["code"])
    except (ConnectionClosed, TimeoutError):
        pass
    return ws.close_code, codes


def test_live_sessions_per_client_address_are_capped(server):
    """Two open sessions from 127.0.0.1 (the default cap): a third is closed with 1013
    too_many_sessions; 127.0.0.2 has its own share; a freed place is usable again."""
    held = [connect(server.ws) for _ in range(2)]
    try:
        for h in held:
            h.send(json.dumps({"type": "session.update", "session": SESSION}))
        assert wait_for(lambda: metric(server.url, "qtts_live_sessions") == 2)
        with connect(server.ws) as third:
            code, errors = _closed_with(third)
        assert code == 1013 and errors == ["too_many_sessions"], (code, errors)
        with _connect_from(server.ws, "127.0.0.2") as other:
            other.send(json.dumps({"type": "session.update", "session": SESSION}))
            assert wait_for(lambda: metric(server.url, "qtts_live_sessions") == 3)
        assert metric(server.url, "qtts_in_flight") == 0  # open sessions without text hold no worker
        held.pop().close()
        assert wait_for(lambda: metric(server.url, "qtts_live_sessions") == 1)
        with connect(server.ws) as again:
            for m in ({"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": "Hi."},
                      {"type": "text.done"}):
                again.send(json.dumps(m))
            code, errors = _closed_with(again)
        assert code == 1000 and errors == []
    finally:
        for h in held:
            h.close()
    assert wait_for(lambda: gauges_at_zero(server))
    assert_healthy(server.url)


def test_later_waiters_go_after_first_ones(monkeypatch):
    """The scheduler serves a waiting new request before a live session's next utterance, unless
    that one has waited PROMOTE_S."""

    async def order(promote_s: float) -> list[str]:
        monkeypatch.setattr(worker, "PROMOTE_S", promote_s)
        sched = Scheduler(["slot"], max_queue=4, queue_timeout_s=30, metrics=ServerMetrics())
        served: list[str] = []

        async def take(name: str, later: bool) -> None:
            slot = await sched.acquire(later=later)
            served.append(name)
            await asyncio.sleep(0.01)
            sched.release(slot)

        slot = await sched.acquire()
        tasks = [asyncio.ensure_future(take("later", True))]
        await asyncio.sleep(0.02)
        tasks.append(asyncio.ensure_future(take("first", False)))
        await asyncio.sleep(0.02)
        sched.release(slot)
        await asyncio.gather(*tasks)
        sched.shutdown()
        return served

    assert asyncio.run(order(60.0)) == ["first", "later"]
    assert asyncio.run(order(0.0)) == ["later", "first"]


@pytest.mark.parametrize("server", [{"ws_max_sessions_per_client": 1}], indirect=True)
def test_a_finished_session_stops_counting_before_its_close_handshake(server, monkeypatch):
    """A client that opens its next session as soon as audio.done arrives is not refused as one
    session too many while the server still closes the finished one (here a close that takes
    2 s, as over a slow link). Before, the place was freed only after the close: 1013."""
    from starlette.websockets import WebSocket

    close = WebSocket.close

    async def slow_close(self, *args, **kwargs):
        await asyncio.sleep(2.0)
        return await close(self, *args, **kwargs)

    monkeypatch.setattr(WebSocket, "close", slow_close)
    session = [{"type": "session.update", "session": SESSION}, {"type": "text.delta", "delta": "Hi."},
               {"type": "text.done"}]
    first = connect(server.ws)
    try:
        for m in session:
            first.send(json.dumps(m))
        while True:  # to audio.done
            msg = first.recv(timeout=60)
            if isinstance(msg, str) and json.loads(msg)["type"] == "audio.done":
                break
        with connect(server.ws) as second:
            for m in session:
                second.send(json.dumps(m))
            code, errors = _closed_with(second)
        assert errors == [] and code == 1000, (code, errors)
    finally:
        first.close()
    assert wait_for(lambda: gauges_at_zero(server))
