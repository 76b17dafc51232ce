"""The server on one batched engine (--max-batch): concurrent streams share its steps and each equals
its offline synthesis, a client leaving does not disturb the others, queue/429 work as before, the
metrics show batch sizes and frame latency, and nothing stays held."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import httpx
import pytest

import qtts
from qtts.audio.chunk import float_to_int16
from qtts.options import SynthesisOptions
from support.server_util import assert_error, assert_healthy, metric, start_server, wait_for

JOBS = [("First voice here.", "vivian", 11), ("Second one, a little longer.", "ryan", 12), ("Third.", "serena", 13),
        ("And the fourth.", "aiden", 14), ("Fifth in line.", "vivian", 15)]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_snapshot):
    path = tiny_snapshot(kind="custom_voice")
    engine = qtts.load(path, threads=1, max_batch=4)
    offline = qtts.load(path, threads=1)
    srv, app = start_server(engine, max_batch=4, max_queue=2, max_frames=48, chunk_frames=4)
    srv.engine, srv.offline, srv.app = engine, offline, app
    yield srv
    srv.stop()
    engine.close()


def speak(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={"model": "qtts", **body}, timeout=120)


def offline_pcm(engine, text: str, speaker: str, seed: int, max_frames: int) -> bytes:
    opts = SynthesisOptions(seed=seed, max_frames=max_frames, chunk_frames=4)
    return float_to_int16(engine.synthesize(text, speaker=speaker, options=opts).samples).tobytes()


def test_concurrent_streams_share_one_engine_and_equal_offline(server):
    refs = [offline_pcm(server.offline, t, s, seed, 8) for t, s, seed in JOBS[:4]]
    steps_before = metric(server.url, "qtts_batch_size_count")
    single_before = metric(server.url, "qtts_batch_size_bucket", le="1")
    with cf.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(speak, server.url, input=t, voice=s, seed=seed, max_frames=8, response_format="pcm")
                for t, s, seed in JOBS[:4]]  # fmt: skip
        results = [f.result() for f in futs]
    for r, ref in zip(results, refs):
        assert r.status_code == 200 and r.content == ref
    steps = metric(server.url, "qtts_batch_size_count") - steps_before
    single = metric(server.url, "qtts_batch_size_bucket", le="1") - single_before
    assert steps > 0 and single < steps  # some talker steps carried more than one stream
    assert metric(server.url, "qtts_frame_seconds_count") >= 32
    info = httpx.get(server.url + "/health").json()
    assert info["max_batch"] == 4 and info["max_concurrency"] == 4
    assert wait_for(lambda: httpx.get(server.url + "/health").json()["batch_active"] == 0, 30)


def test_client_leaving_does_not_disturb_the_others(server):
    refs = [offline_pcm(server.offline, t, s, seed, 10) for t, s, seed in JOBS[:2]]
    cancelled = metric(server.url, "qtts_requests_cancelled_total")

    def leave():
        body = {"model": "qtts", "input": "A long line that would take many frames.", "voice": "ryan", "seed": 3,
                "max_frames": 48, "response_format": "pcm"}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=120) as r:
            assert r.status_code == 200
            return len(next(r.iter_raw()))

    with cf.ThreadPoolExecutor(3) as pool:
        gone = pool.submit(leave)
        futs = [pool.submit(speak, server.url, input=t, voice=s, seed=seed, max_frames=10, response_format="pcm")
                for t, s, seed in JOBS[:2]]  # fmt: skip
        results = [f.result() for f in futs]
        assert gone.result() > 0
    for r, ref in zip(results, refs):
        assert r.status_code == 200 and r.content == ref
    assert wait_for(lambda: metric(server.url, "qtts_requests_cancelled_total") == cancelled + 1, 60)
    assert wait_for(lambda: httpx.get(server.url + "/health").json()["batch_active"] == 0, 30)
    assert_healthy(server.url)


def test_queue_and_429_unchanged(server):
    """4 streams run (the batch), 2 wait (max_queue), the 7th gets 429 with Retry-After. The engine
    is held still by an observer (it runs on the engine thread after each step) until the end."""
    gate = threading.Event()
    hold = lambda stats: gate.wait(60)  # noqa: E731
    server.engine.batch.add_observer(hold)
    body = {"input": "Hold this stream.", "voice": "vivian", "max_frames": 4, "response_format": "pcm"}
    try:
        with cf.ThreadPoolExecutor(6) as pool:
            running = [pool.submit(speak, server.url, **body) for _ in range(4)]
            assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 4, 30)
            queued = [pool.submit(speak, server.url, **body) for _ in range(2)]
            assert wait_for(lambda: metric(server.url, "qtts_queue_depth") == 2, 30)
            r = speak(server.url, **body)
            assert_error(r, 429, "busy")
            assert int(r.headers["retry-after"]) >= 1
            gate.set()
            assert all(f.result().status_code == 200 for f in running + queued)
    finally:
        gate.set()
        server.engine.batch.remove_observer(hold)
    assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0, 60)
    assert wait_for(lambda: httpx.get(server.url + "/health").json()["batch_active"] == 0, 30)
