"""Small parts of the live speech WebSocket: its close codes and errors, its text queue, a message
rate, JSON nesting, what counts as progress (the frame cap: :class:`qtts.engine.request.FrameCap`)."""

from __future__ import annotations

import queue
import time

from ..text.prompt import speakable  # noqa: F401 (the one rule for empty text; used by the live session)

#: close codes (RFC 6455): normal, policy violation (bad input, limits), message too big,
#: internal error, try again later (busy, not ready)
NORMAL, POLICY, TOO_BIG, INTERNAL, BUSY = 1000, 1008, 1009, 1011, 1013

#: deepest JSON nesting a message may have (the protocol's own messages nest 3 levels)
MAX_JSON_DEPTH = 16
#: a message longer than this many characters per allowed text.delta character is refused before
#: it is parsed (a JSON escape takes at most 12 characters per character: a surrogate pair)
ESCAPE_FACTOR = 12
#: room for the other fields of a message (session.update: instruct, language, ...)
MESSAGE_OVERHEAD = 16 * 1024


class SessionError(Exception):
    """An ``error`` event for the client; ``close`` set = the session ends with that close code."""

    def __init__(self, code: str, message: str, close: int | None = POLICY):
        super().__init__(message)
        self.code, self.message, self.close = code, message, close


class Disconnected(Exception):
    """The client went away (or stopped reading)."""


class TextPieces:
    """Text deltas from the event loop to the engine's reader thread: a blocking iterable."""

    _END = object()

    def __init__(self):
        self._q: queue.SimpleQueue = queue.SimpleQueue()

    def push(self, piece: str) -> None:
        self._q.put(piece)

    def close(self) -> None:
        self._q.put(self._END)

    def __iter__(self):
        while (item := self._q.get()) is not self._END:
            yield item


class TokenBucket:
    """``rate`` events per second on average, bursts of ``burst``; ``take()`` is False past that."""

    def __init__(self, rate: float, burst: float | None = None):
        self.rate = rate
        self.burst = burst if burst is not None else 2 * rate
        self.tokens, self.at = self.burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def too_deep(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when a parsed JSON value nests lists/objects more than ``limit`` levels (iterative)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False

