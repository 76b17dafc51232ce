"""Fair share by client address (issue 26: no client can hold or fill the server): a freed slot
goes to the address holding the fewest slots, and a full queue makes room for an address with
nothing queued. Against a real server on loopback: the clients bind 127.0.0.1 and 127.0.0.2."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import httpx
import pytest

import qtts
from qtts.server.metrics import ServerMetrics
from qtts.server.worker import Scheduler, Shares
from support.server_util import GatedBackend, assert_healthy, metric, start_server, wait_for

BODY = {"input": "Hi there.", "voice": "vivian", "response_format": "pcm", "max_frames": 4}


@pytest.fixture(scope="module")
def gate():
    g = threading.Event()
    g.set()
    return g


@pytest.fixture(scope="module")
def engine(tiny_snapshot, gate):
    tts = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
    return qtts.TTS(dataclasses.replace(tts.components, backend=GatedBackend(tts.components.backend, gate)))


@pytest.fixture()
def server(engine, gate):
    srv, _ = start_server(engine, capacity=1, max_queue=4)
    yield srv
    gate.set()
    srv.stop()


class Request(threading.Thread):
    """One streamed speech request from ``source``: its status and when its first byte came."""

    def __init__(self, url: str, source: str, name: str, headers: dict | None = None):
        super().__init__(daemon=True)
        self.url, self.source, self.name, self.headers = url, source, name, headers
        self.status, self.first = None, None

    def run(self) -> None:
        transport = httpx.HTTPTransport(local_address=self.source)
        with httpx.Client(transport=transport, timeout=120) as client:
            with client.stream("POST", self.url + "/v1/audio/speech", json=BODY, headers=self.headers) as r:
                self.status = r.status_code
                for _ in r.iter_raw():
                    self.first = self.first or time.monotonic()


def send(srv, source: str, name: str, queued: int, headers: dict | None = None) -> Request:
    """Start a request and wait until the server has it in flight or queued (``queued`` waiting)."""
    req = Request(srv.url, source, name, headers)
    req.start()
    assert wait_for(lambda: metric(srv.url, "qtts_in_flight") == 1
                    and metric(srv.url, "qtts_queue_depth") == queued or req.status is not None, 30)
    return req


def test_a_second_address_is_served_before_the_first_ones_queue(server, gate):
    """A holds the slot and queues 3 more; B's one request goes next (FIFO made it wait for all)."""
    gate.clear()
    a = [send(server, "127.0.0.1", "a0", 0)] + [send(server, "127.0.0.1", f"a{i}", i) for i in (1, 2, 3)]
    b = send(server, "127.0.0.2", "b0", 4)
    gate.set()
    for r in a + [b]:
        r.join(120)
    assert all(r.status == 200 and r.first for r in a + [b]), [(r.name, r.status) for r in a + [b]]
    order = [r.name for r in sorted(a + [b], key=lambda r: r.first)]
    assert order == ["a0", "b0", "a1", "a2", "a3"], order
    assert_healthy(server.url)


def test_one_address_cannot_fill_the_queue_for_another(server, gate):
    """A fills the slot and the queue; its next request is refused (429), but B's takes the place of
    A's newest waiter, which gets the 429 instead; everything else is served."""
    gate.clear()
    a = [send(server, "127.0.0.1", "a0", 0)] + [send(server, "127.0.0.1", f"a{i}", i) for i in (1, 2, 3, 4)]
    extra = Request(server.url, "127.0.0.1", "a5")
    extra.run()
    assert extra.status == 429
    b = send(server, "127.0.0.2", "b0", 4)
    assert wait_for(lambda: a[4].status is not None, 30) and a[4].status == 429
    gate.set()
    for r in a + [b]:
        r.join(120)
    assert [r.status for r in a[:4]] == [200] * 4 and b.status == 200
    assert wait_for(lambda: metric(server.url, "qtts_in_flight") == 0 and metric(server.url, "qtts_queue_depth") == 0)


def test_the_share_table_forgets_idle_addresses(monkeypatch):
    """Many addresses that came and went leave nothing behind once their usage has decayed."""
    shares = Shares()
    for i in range(1000):
        shares.take(f"10.0.{i // 256}.{i % 256}")
        shares.give(f"10.0.{i // 256}.{i % 256}")
    clock = [time.monotonic() + 3600]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    shares.take("10.9.9.9")
    clock[0] += 1.0  # held for a second: remembered
    shares.give("10.9.9.9")
    assert set(shares._used) == {"10.9.9.9"} and not shares._held


def test_the_fair_share_orders_by_slots_held_then_recent_use():
    """Unit level: with one slot held by A and two free slots taken in turn, waiters are served by
    (slots held, recent slot-seconds, arrival)."""

    async def run() -> list[str]:
        sched = Scheduler(["s1", "s2"], max_queue=8, queue_timeout_s=30, metrics=ServerMetrics())
        held = [await sched.acquire(owner="A"), await sched.acquire(owner="A")]
        served: list[str] = []

        async def take(name: str, owner: str) -> None:
            slot = await sched.acquire(owner=owner)
            served.append(name)
            await asyncio.sleep(0.01)
            sched.release(slot, owner)

        tasks = []
        for name, owner in (("a", "A"), ("a'", "A"), ("b", "B"), ("c", "C")):
            tasks.append(asyncio.ensure_future(take(name, owner)))
            await asyncio.sleep(0.01)
        sched.release(held.pop(), "A")  # A still holds one: B (first come among the empty-handed) next
        await asyncio.sleep(0.005)
        sched.release(held.pop(), "A")
        await asyncio.gather(*tasks)
        sched.shutdown()
        return served

    served = asyncio.run(run())
    assert served[:2] == ["b", "c"], served
    assert served[2:] == ["a", "a'"], served


def test_a_freed_slot_goes_to_another_address_before_its_own():
    """B used the one slot lately (it is the heavier address) and waits; A, lighter, holds the
    slot and has two more requests queued. When A's request ends, the slot goes to B: A still
    counts it at the hand-over, so its own queue goes after every other address's waiter (before:
    A held nothing once it gave the slot back and had used less, so its queued requests took the
    slot back one after another while B waited behind all of them). Wyoming's turns likewise."""
    from qtts.server.shares import Turns

    async def scheduled() -> list[str]:
        sched = Scheduler(["s1"], max_queue=8, queue_timeout_s=30, metrics=ServerMetrics())
        slot, served = await sched.acquire(owner="B"), []
        await asyncio.sleep(0.2)
        sched.release(slot, "B")  # B: 0.2 slot-seconds lately, A: none
        held = await sched.acquire(owner="A")

        async def take(name: str, owner: str) -> None:
            got = await sched.acquire(owner=owner)
            served.append(name)
            await asyncio.sleep(0.01)
            sched.release(got, owner)

        tasks = []
        for name, owner in (("a1", "A"), ("a2", "A"), ("b", "B")):
            tasks.append(asyncio.ensure_future(take(name, owner)))
            await asyncio.sleep(0.01)
        sched.release(held, "A")
        await asyncio.gather(*tasks)
        sched.shutdown()
        return served

    async def turned() -> list[str]:
        turns, served = Turns(), []
        await turns.take("B")
        await asyncio.sleep(0.2)
        turns.give("B")
        await turns.take("A")

        async def take(name: str, owner: str) -> None:
            await turns.take(owner)
            served.append(name)
            await asyncio.sleep(0.01)
            turns.give(owner)

        tasks = []
        for name, owner in (("a1", "A"), ("a2", "A"), ("b", "B")):
            tasks.append(asyncio.ensure_future(take(name, owner)))
            await asyncio.sleep(0.01)
        turns.give("A")
        await asyncio.gather(*tasks)
        return served

    assert asyncio.run(scheduled()) == ["b", "a1", "a2"]
    assert asyncio.run(turned()) == ["b", "a1", "a2"]
