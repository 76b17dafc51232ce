"""Admission by capacity: a batched server holds ``capacity`` streams, queues the next ones and answers
429 with Retry-After past the queue (never a stalled stream); /health and /metrics expose capacity,
active streams and per-stream real-time margin; every gauge is back at 0 after a cancel storm; the
start-up probe measures a capacity between 1 and the batch size."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import httpx
import pytest

import qtts
from qtts.server.capacity import ProbeOptions, measure_capacity
from qtts.server.metrics import ServerMetrics, capacity_gauges
from support.server_util import assert_error, metric, start_server, wait_for


@pytest.fixture(scope="module")
def engine(tiny_snapshot):
    tts = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1, max_batch=4)
    yield tts
    tts.close()


@pytest.fixture(scope="module")
def server(engine):
    srv, app = start_server(engine, max_batch=4, capacity=2, max_queue=1, max_frames=48, chunk_frames=4)
    yield srv
    srv.stop()


def speak(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={"model": "qtts", **body}, timeout=120)


def test_beyond_capacity_requests_queue_then_get_429_and_none_stalls(server, engine):
    gate = threading.Event()
    hold = lambda stats: gate.wait(60)  # noqa: E731  (the engine stands still until the gate opens)
    engine.batch.add_observer(hold)
    body = {"input": "Hold this stream.", "voice": "vivian", "seed": 1, "max_frames": 6, "response_format": "pcm"}
    try:
        with cf.ThreadPoolExecutor(3) as pool:
            running = [pool.submit(speak, server.url, **body) for _ in range(2)]
            assert wait_for(lambda: metric(server.url, "qtts_active_streams") == 2, 30)
            queued = pool.submit(speak, server.url, **body)
            assert wait_for(lambda: metric(server.url, "qtts_queue_depth") == 1, 30)
            health = httpx.get(server.url + "/health").json()
            assert health["capacity"] == 2 and health["active_streams"] == 2 and health["max_batch"] == 4
            assert engine.batch.active + engine.batch.waiting <= 2  # the engine never holds more than capacity
            r = speak(server.url, **body)
            assert_error(r, 429, "busy")
            assert int(r.headers["retry-after"]) >= 1
            gate.set()
            done = [f.result() for f in running + [queued]]
    finally:
        gate.set()
        engine.batch.remove_observer(hold)
    assert all(d.status_code == 200 for d in done)
    assert len({d.content for d in done}) == 1 and len(done[0].content) > 0  # each got its whole audio
    assert metric(server.url, "qtts_capacity") == 2


def test_gauges_return_to_zero_after_a_cancel_storm(server, engine):
    cancelled = metric(server.url, "qtts_requests_cancelled_total")

    def leave(i):
        body = {"model": "qtts", "input": "A long line that would take many frames to say.", "voice": "ryan",
                "seed": i, "max_frames": 48, "response_format": "pcm"}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=120) as r:
            if r.status_code != 200:
                return r.status_code
            next(r.iter_raw())
            return 200

    with cf.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(leave, range(6)))
    assert set(codes) <= {200, 429} and 200 in codes
    assert wait_for(lambda: metric(server.url, "qtts_requests_cancelled_total") > cancelled, 60)
    zero = ("qtts_in_flight", "qtts_queue_depth", "qtts_active_streams")
    assert wait_for(lambda: all(metric(server.url, m) == 0 for m in zero), 60)
    assert wait_for(lambda: engine.batch.active + engine.batch.waiting == 0, 30)
    assert wait_for(lambda: engine.vocoder_batch.active == 0, 30)
    assert metric(server.url, "qtts_stream_margin_seconds", stat="min") == 0
    assert httpx.get(server.url + "/health").json()["margin_s"] == []


class _Sched:
    capacity, in_flight = 3, 2


class _Batcher:
    def margins(self):
        return [0.5, -0.25]


class _Engine:
    vocoder_batch = _Batcher()


def test_capacity_gauges_report_the_margins_of_the_active_streams():
    m = ServerMetrics()
    info = capacity_gauges(m, _Sched(), _Engine())
    assert info == {"capacity": 3, "active_streams": 2, "margin_s": [-0.25, 0.5]}
    text = m.render()
    assert 'qtts_stream_margin_seconds{stat="min"} -0.25' in text and "qtts_capacity 3" in text
    assert capacity_gauges(m, _Sched(), object())["margin_s"] == []


def test_the_start_up_probe_measures_between_one_and_the_batch_size(engine, caplog):
    assert measure_capacity(engine, ProbeOptions(frames=4, rtf_limit=1e9)) == engine.max_batch
    assert "even one stream" not in caplog.text
    assert measure_capacity(engine, ProbeOptions(frames=4, rtf_limit=0.0)) == 1  # at least one stream
    assert "even one stream runs at RTF" in caplog.text  # and the log says that one is not real time


@pytest.mark.parametrize("kind,layout", [("base", "0.6b"), ("voice_design", "1.7b")])
def test_the_probe_speaks_with_every_kind_of_checkpoint(tiny_snapshot, kind, layout):
    tts = qtts.load(tiny_snapshot(kind=kind, layout=layout), threads=1, max_batch=2)
    try:
        assert measure_capacity(tts, ProbeOptions(frames=2, rtf_limit=1e9)) == 2
    finally:
        tts.close()
