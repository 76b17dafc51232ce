"""The fair share by client address (fastapi-free, so the Wyoming service uses the same rule).

:class:`Shares` keeps, per client address (:mod:`qtts.server.clients`), the slots it holds now and
the slot-seconds it held lately; whoever has the smaller ``key`` goes first. The HTTP and WebSocket
queue (:class:`qtts.server.worker.Scheduler`) hands its slots out by it; :class:`Turns` hands out
one resource (the Wyoming service's one engine) by it.
"""

from __future__ import annotations

import asyncio
import math
import time

#: time constant (s) of an address's recent slot-seconds, the second key of the fair share
SHARE_TAU_S = 60.0


class Shares:
    """Per client address: slots held now and slot-seconds held lately (an exponential decay with
    time constant SHARE_TAU_S). Addresses that hold nothing and have decayed away are dropped, so
    the table stays as small as the set of recent clients."""

    def __init__(self):
        self._held: dict[str, list[float]] = {}  # owner -> start times of the slots it holds
        self._used: dict[str, tuple[float, float]] = {}  # owner -> (slot-seconds, at time)

    def take(self, owner: str) -> None:
        self._held.setdefault(owner, []).append(time.monotonic())

    def give(self, owner: str) -> None:
        starts = self._held.get(owner)
        if not starts:
            return
        now = time.monotonic()
        held_s = now - starts.pop(0)  # the pairing does not change the sum of the seconds
        if not starts:
            del self._held[owner]
        self._used[owner] = (self.used(owner, now) + held_s, now)
        self._prune(now)

    def used(self, owner: str, now: float) -> float:
        value, at = self._used.get(owner, (0.0, now))
        return value * math.exp(-(now - at) / SHARE_TAU_S)

    def key(self, owner: str, now: float) -> tuple[int, float]:
        """Smaller is served first."""
        return len(self._held.get(owner, ())), self.used(owner, now)

    def _prune(self, now: float) -> None:
        for owner in [o for o in self._used if o not in self._held and self.used(o, now) < 0.01]:
            del self._used[owner]


class Turns:
    """One resource taken in turns: a free one goes at once; a freed one goes to the waiter whose
    address has the smallest :meth:`Shares.key` (holds least now, the address giving it back still
    counting it; then held least lately), then the longest waiting. Use from the event-loop thread
    only."""

    def __init__(self):
        self.shares = Shares()
        self.busy = False
        self._waiters: list[tuple[float, str, asyncio.Future]] = []

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w[2].done())

    async def take(self, owner: str) -> None:
        if not self.busy and not self.waiting:
            self.busy = True
            self.shares.take(owner)
            return
        waiter = (time.monotonic(), owner, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter[2]
        except asyncio.CancelledError:
            if waiter[2].done() and not waiter[2].cancelled():
                self.give(owner)  # it was handed over as the waiter left: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def give(self, owner: str) -> None:
        """``owner`` is done with it: to the next waiter by the fair share (chosen while ``owner``
        still counts it, so it goes back to ``owner`` only when no other address waits), or free."""
        now = time.monotonic()
        live = [w for w in self._waiters if not w[2].done()]
        self._waiters = live
        nxt = min(live, key=lambda w: (*self.shares.key(w[1], now), w[0]), default=None)
        self.shares.give(owner)
        if nxt is None:
            self.busy = False
            return
        self._waiters.remove(nxt)
        self.shares.take(nxt[1])
        nxt[2].set_result(None)
