"""Concurrency: a pool of engine slots, a bounded wait queue, and jobs on worker threads.

* :class:`Scheduler` hands out *slots*. A slot is one engine handle; a job holds it while its
  worker thread runs, so at most ``max_concurrency`` generations run at once. When every slot is
  busy, up to ``max_queue`` requests wait; one more gets 429 with ``Retry-After``. Waiters are
  served in arrival order, except that a *later* waiter (a live session's next
  utterance: its listener already has audio) goes after every *first* waiter (a new request, a
  session's first utterance) until it has waited ``PROMOTE_S``.
  **Fair share by client address** (the ``owner`` of a waiter): among the waiters the rule above
  lets go, a freed slot goes to the address that holds the fewest slots now (the address giving it
  back still counts it), then to the one that held slots for the fewest seconds lately (decaying
  with ``SHARE_TAU_S``), then first come, first served; so one address with many requests never
  makes another address wait behind all of them, even one that used more lately.
  When the queue is full, a newcomer from an address with nothing queued takes the place of the
  newest waiter of the address with the most queued (at least 2; that waiter gets the 429), so one
  address cannot fill the queue for everyone. All scheduler state lives on the event-loop thread;
  workers give slots back through ``loop.call_soon_threadsafe``.
* :class:`Job` runs a blocking producer (the engine's ``stream()`` plus the format writer) on a worker
  thread and passes its byte chunks to the event loop through an ``asyncio.Queue``. ``cancel()``
  sets a flag the worker checks between chunks; it then closes the producer, which closes the
  engine generator (generation stops at the next frame/chunk boundary). The slot is returned only
  when the worker thread has really finished, so cancelled work never overlaps new work.
  An exception in one job is delivered to that job's consumer only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .errors import ApiError
from .metrics import ServerMetrics
from .shares import SHARE_TAU_S, Shares  # noqa: F401 (the fair share: one rule, also Wyoming's)

log = logging.getLogger(__name__)

#: a later waiter (a live session's next utterance) that waited this long is served like a first one
PROMOTE_S = 5.0
#: the owner of a slot taken without an address (tests, internal callers, a client uvicorn did not name)
NOBODY = "?"


@dataclass(eq=False)
class _Waiter:
    fut: asyncio.Future
    later: bool
    owner: str = NOBODY
    since: float = field(default_factory=time.monotonic)


def address(conn) -> str:
    """The client address of a Starlette request or WebSocket (the fair share's owner)."""
    client = getattr(conn, "client", None)
    return client.host if client else NOBODY


class Scheduler:
    """Slots (engine handles) + a bounded queue of waiters (module docstring). Use only from the
    event-loop thread."""

    def __init__(self, slots: list, max_queue: int, queue_timeout_s: float, metrics: ServerMetrics):
        self.capacity = len(slots)
        self._free = list(slots)
        self._waiters: deque[_Waiter] = deque()
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.metrics = metrics
        self._avg_job_s = 1.0  # moving average, for Retry-After
        self.shares = Shares()
        self.executor = ThreadPoolExecutor(max_workers=self.capacity, thread_name_prefix="qtts-worker")

    @property
    def in_flight(self) -> int:
        return self.capacity - len(self._free)

    @property
    def queue_depth(self) -> int:
        return sum(1 for w in self._waiters if not w.fut.done())

    def retry_after(self) -> int:
        """Seconds until a queue place is likely free (at least 1)."""
        ahead = self.queue_depth + 1
        return max(1, min(120, math.ceil(ahead * self._avg_job_s / self.capacity)))

    def note_duration(self, seconds: float) -> None:
        self._avg_job_s = 0.8 * self._avg_job_s + 0.2 * max(0.01, seconds)

    def _gauges(self) -> None:
        self.metrics.queue_depth.set(self.queue_depth)
        self.metrics.in_flight.set(self.in_flight)

    def _busy(self) -> ApiError:
        return ApiError(
            429,
            f"server busy: {self.capacity} generation(s) running and {self.queue_depth} waiting "
            f"(max_queue={self.max_queue}); retry after the Retry-After seconds",
            "queue_full",
            headers={"Retry-After": str(self.retry_after())},
        )

    async def acquire(self, later: bool = False, owner: str = NOBODY):
        """A free slot; waits in the queue, or raises ApiError 429 (queue full) / 503 (timeout).
        ``later``: a live session's next utterance (served after first waiters, module docstring);
        ``owner``: the client address (the fair share). Give the slot back with the same owner."""
        if self._free and self.queue_depth == 0:
            slot = self._free.pop()
            self.shares.take(owner)
            self._gauges()
            return slot
        if self.queue_depth >= self.max_queue and not self._make_room(owner):
            raise self._busy()
        fut = asyncio.get_running_loop().create_future()
        waiter = _Waiter(fut, later, owner)
        self._waiters.append(waiter)
        self._gauges()
        t0 = time.perf_counter()
        try:
            slot = await asyncio.wait_for(fut, self.queue_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(503, f"no worker became free within {self.queue_timeout_s:.0f} s; retry later",
                           "queue_timeout", headers={"Retry-After": str(self.retry_after())}) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result(), owner)
            raise
        finally:
            if waiter in self._waiters and fut.done():
                self._waiters.remove(waiter)
            self._gauges()
        self.metrics.queue_wait.observe(time.perf_counter() - t0)
        return slot

    def _make_room(self, owner: str) -> bool:
        """The queue is full: if ``owner`` has nothing queued, refuse (429) the newest waiter of the
        address with the most queued, when that is 2 or more. True when a place was made."""
        live = [w for w in self._waiters if not w.fut.done()]
        per: dict[str, list[_Waiter]] = {}
        for w in live:
            per.setdefault(w.owner, []).append(w)
        if owner in per or not per:
            return False
        crowd = max(per.values(), key=len)
        if len(crowd) < 2:
            return False
        victim = crowd[-1]
        self._waiters.remove(victim)
        victim.fut.set_exception(self._busy())
        log.info("queue full: a request from %s takes the place of the newest of %d from %s",
                 owner, len(crowd), victim.owner)
        return True

    async def acquire_unless(self, gone: Callable[[], Awaitable[bool]], poll_s: float = 0.25, later: bool = False,
                             owner: str = NOBODY):
        """Like :meth:`acquire`, but a request whose client left while queued (``await gone()``)
        gives up its place: ApiError 499, and no generation is started for it."""
        if self._free and self.queue_depth == 0:
            return await self.acquire(later, owner)
        task = asyncio.ensure_future(self.acquire(later, owner))
        handed_over = False
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll_s)
                if done:
                    handed_over = True
                    return task.result()
                if await gone():
                    raise ApiError(499, "the client closed the connection while queued", "client_closed")
        finally:
            if not handed_over:
                await self._drop(task, owner)

    async def _drop(self, task: asyncio.Future, owner: str) -> None:
        """Cancel a pending acquire; a slot it obtained anyway goes back to the pool."""
        if not task.done():
            task.cancel()
        try:
            slot = await task
        except (asyncio.CancelledError, ApiError):
            return
        self.release(slot, owner)

    def release(self, slot, owner: str = NOBODY) -> None:
        """Give back a slot that ``owner`` took. The next waiter is chosen while ``owner`` still
        counts it, so a freed slot goes back to its own address only when no other address waits."""
        waiter = self._next_waiter()
        self.shares.give(owner)
        if waiter is not None:
            self._waiters.remove(waiter)
            self.shares.take(waiter.owner)
            waiter.fut.set_result(slot)
        else:
            self._free.append(slot)
        self._gauges()

    def _next_waiter(self) -> _Waiter | None:
        """Among the first waiters (and later ones that waited PROMOTE_S), else among the later
        ones: the one whose address has the smallest share, then the oldest (module docstring)."""
        while self._waiters and self._waiters[0].fut.done():
            self._waiters.popleft()
        now = time.monotonic()
        live = [w for w in self._waiters if not w.fut.done()]
        due = [w for w in live if not w.later or now - w.since >= PROMOTE_S] or live
        return min(due, key=lambda w: (*self.shares.key(w.owner, now), w.since), default=None)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class Job:
    """One producer run on a worker thread; ``await next()`` yields ("data", bytes), ("end", None)
    or ("error", exception)."""

    def __init__(self, scheduler: Scheduler, slot, produce: Callable[[object, threading.Event], Iterator[bytes]],
                 owner: str = NOBODY):
        self.scheduler = scheduler
        self.slot, self.owner = slot, owner
        self._produce = produce
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue = asyncio.Queue()
        self.cancel_event = threading.Event()
        self.done = self._loop.create_future()
        self.started = time.perf_counter()

    def start(self) -> None:
        try:
            self.scheduler.executor.submit(self._run)
        except RuntimeError:  # executor shut down: the server is stopping
            self.scheduler.release(self.slot, self.owner)
            raise ApiError(503, "server is shutting down", "shutting_down") from None

    def cancel(self) -> None:
        self.cancel_event.set()

    async def next(self):
        return await self._items.get()

    async def wait_done(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(self.done), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def _put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # event loop closed: nobody listens any more
            self.cancel_event.set()

    def _finished(self) -> None:
        self.scheduler.note_duration(time.perf_counter() - self.started)
        self.scheduler.release(self.slot, self.owner)
        if not self.done.done():
            self.done.set_result(None)

    def _run(self) -> None:
        producer = None
        try:
            producer = self._produce(self.slot, self.cancel_event)
            for data in producer:
                if self.cancel_event.is_set():
                    break
                if data:
                    self._put(("data", data))
            else:
                self._put(("end", None))
        except Exception as exc:  # delivered to this job's consumer only
            self._put(("error", exc))
        finally:
            if producer is not None:
                try:
                    producer.close()
                except Exception:
                    log.exception("closing a generation failed")
            try:
                self._loop.call_soon_threadsafe(self._finished)
            except RuntimeError:
                pass
