"""Connection guards on top of uvicorn's h11 protocol: header, body and write timeouts and a
connection cap.

uvicorn closes idle keep-alive connections, but a client that opens a connection and sends
nothing, sends its headers a byte at a time, or announces a body it never finishes is held for
as long as it likes, and every such connection costs a file descriptor. This protocol class
follows the h11 state of the client's side of each connection:

* waiting for a request (``IDLE``): the complete headers must arrive within ``header_timeout_s``
  of the connection opening (or of the previous response ending);
* reading the body (``SEND_BODY``): the whole body must arrive within ``body_timeout_s`` of the
  headers (a total, not an idle timer, so a 1 byte/s trickle is cut too);
* a response whose client stops reading (the transport's send buffer stays full) is aborted
  after ``write_timeout_s``;
* past ``max_connections`` open connections, or ``max_connections_per_client`` from one client
  address (a named proxy counts against the total only, :mod:`qtts.server.clients`), a new one is
  answered 503 and closed: the answer and a FIN first, then what the client still sends (its
  request) is read and dropped for up to ``LINGER_S``, so the client reads the 503 instead of a
  TCP reset.

A WebSocket upgrade hands the transport to :class:`GuardedWebSocketProtocol` (uvicorn's sans-I/O
``websockets`` protocol); the header and body timers stop there (a live speech session may last
many minutes; it has its own idle and length limits), and the socket keeps a write deadline: a
client that reads nothing for ``write_timeout_s`` while audio waits is aborted. Pings are
answered only while the client reads what the server sends (reading from the socket pauses
while the send buffer is full, so a ping flood waits in the client's own buffers), and more
than ``ws_max_pings_per_s`` (a burst of twice as many) closes the socket with 1008.

A timed-out request that has no response yet gets ``408`` (OpenAI-style JSON) before the close;
an idle keep-alive connection that has not started its next request is closed without one (a
client reusing it at that moment would take the 408 for its new request's answer). Every close is
counted in ``qtts_connections_closed_total{reason}``.
"""

from __future__ import annotations

import json
import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from .errors import error_body

log = logging.getLogger(__name__)
#: a refused connection's lingering close: its 503 has this long to reach the client while what the
#: client still sends is read and dropped
LINGER_S = 2.0


def _raw_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n")
    return head.encode("latin-1") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the guards of the module docstring; ``state`` (the app's
    :class:`qtts.server.app.ServerState`) is set on the subclass made by :func:`guarded_protocol`."""

    state = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._phase: str | None = None
        self._timer = None
        self._write_timer = None
        self._served = False  # a response was completed on this connection
        self._partial = False  # bytes of the next request arrived, its headers are not complete
        self._refused = False
        refusal = over_limit(self.connections, self.client, self.state.settings, self._proxies())
        if refusal is not None:
            self._refuse(refusal)
            return
        self._follow()

    def _proxies(self):
        cls = type(self)
        if "_proxy_set" not in cls.__dict__:  # once per server (the class is made per app)
            from .clients import Proxies

            cls._proxy_set = Proxies(self.state.settings.forwarded_allow_ips)
        return cls._proxy_set

    def _refuse(self, refusal: tuple[str, str]) -> None:
        """503 and a lingering close: the answer and a FIN go out, what the client still sends is
        read and dropped for up to LINGER_S (closing with unread bytes would send a TCP reset,
        which destroys the answer before the client reads it)."""
        self._count(refusal[0])
        self._refused = True
        self.connections.discard(self)  # it no longer counts against a cap
        self.transport.write(_raw_response(503, "Service Unavailable", refusal[1], "retry-after: 1\r\n"))
        cls = type(self)
        if self.transport.can_write_eof() and cls._lingering < self.state.settings.max_connections:
            cls._lingering += 1  # (a flood of refused connections lingers no more than the cap's worth)
            self.transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self._refused = False  # closed at once, as before
            self.transport.close()

    _lingering = 0  # refused connections in their lingering close now (per server class)

    def eof_received(self):
        if self._refused:
            self.transport.close()
            return None
        return super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the lingering close of a refused connection: dropped
        super().data_received(data)
        self._follow()
        self._partial = self._phase == "headers"

    def handle_websocket_upgrade(self, event) -> None:
        self._cancel()
        self._cancel_write()
        self._phase = "websocket"  # _follow() arms no timer from now on
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        self._served = True
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc) -> None:
        if self._refused:
            type(self)._lingering -= 1
            self._refused = False
        self._cancel()
        self._cancel_write()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.state.settings.write_timeout_s, self._write_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_write()

    # -- the guards --------------------------------------------------------------------------
    def _follow(self) -> None:
        """Arm the timer that matches what the client owes us now (nothing: no timer)."""
        if self.transport.is_closing() or self._phase == "websocket":
            return
        theirs = self.conn.their_state
        phase = "headers" if theirs is h11.IDLE else "body" if theirs is h11.SEND_BODY else None
        if phase == self._phase:
            return  # a deadline runs from the start of its phase, not from the last byte
        self._cancel()
        self._phase = phase
        self._partial = False
        if phase is not None:
            s = self.state.settings
            delay = s.header_timeout_s if phase == "headers" else s.body_timeout_s
            self._timer = self.loop.call_later(delay, self._timeout, phase)

    def _timeout(self, phase: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        s = self.state.settings
        if phase == "headers" and self._served and not self._partial:
            self.transport.close()  # an idle keep-alive connection: no request started, no answer owed
            return
        self._count("header_timeout" if phase == "headers" else "body_timeout")
        if phase == "headers" or self.cycle is None or not self.cycle.response_started:
            limit = s.header_timeout_s if phase == "headers" else s.body_timeout_s
            what = "the request headers" if phase == "headers" else "the request body"
            self.transport.write(_raw_response(408, "Request Timeout", f"{what} did not arrive within "
                                               f"{limit:g} s; the connection is closed"))
        self._drop_cycle()
        self.transport.close()

    def _write_timeout(self) -> None:
        self._write_timer = None
        if self.transport.is_closing():
            return
        self._count("write_timeout")
        self._drop_cycle()
        self.transport.abort()  # close() would wait for the unread buffer to drain

    def _drop_cycle(self) -> None:
        """The request in progress sees a disconnect and its later sends are dropped."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()

    def _count(self, reason: str) -> None:
        self.state.metrics.connections_closed.inc(reason=reason)
        log.info("closing a connection from %s: %s", self.client, reason.replace("_", " "))

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = None

    def _cancel_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None


def over_limit(connections, client, settings, proxies=()) -> tuple[str, str] | None:
    """(reason, message) when one more connection from ``client`` passes a connection cap (a named
    proxy in ``proxies`` counts against the total only: :mod:`qtts.server.clients`)."""
    limit = settings.max_connections
    if len(connections) > limit:
        return "over_limit", f"too many open connections (the limit is {limit}); retry shortly"
    host = client[0] if client else None
    per = settings.max_connections_per_client
    if host is not None and len(connections) > per and host not in proxies:
        mine = sum(1 for c in connections if (getattr(c, "client", None) or (None,))[0] == host)
        if mine > per:
            return "over_client_limit", (f"too many open connections from {host} (the limit is {per} per client "
                                         "address); close some, or retry shortly")
    return None


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with a write deadline, ping limits and backpressure (module
    docstring); ``state`` is set on the subclass made by :func:`guarded_ws_protocol`."""

    state = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._write_timer = None
        rate = self.state.settings.ws_max_pings_per_s
        self._ping_rate, self._ping_burst = rate, 2 * rate
        self._ping_tokens, self._ping_at = 2 * rate, time.monotonic()
        self._reading_held = False  # reading paused because the send buffer is full
        self._reap_timer = None  # aborts a finished session's socket that never drains (run_asgi)

    def connection_lost(self, exc) -> None:
        self._cancel_write()
        if self._reap_timer is not None:  # a pending timer holds this protocol (and its queue) alive
            self._reap_timer.cancel()
            self._reap_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if not self._reading_held and not self.transport.is_closing():
            self._reading_held = True
            self.transport.pause_reading()  # backpressure: pings and messages wait in the client's buffers
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.state.settings.write_timeout_s, self._write_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_write()
        if self._reading_held:
            self._reading_held = False
            if not self.read_paused and not self.transport.is_closing():
                self.transport.resume_reading()

    async def receive(self):
        message = await self.queue.get()
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            if not self._reading_held:  # (uvicorn's resumes reading here, even with a full send buffer)
                self.transport.resume_reading()
        return message

    async def run_asgi(self) -> None:
        await super().run_asgi()
        # the session is over; a client that never reads its last frames (or the close) would keep
        # the socket open while the transport waits to flush: abort it after the write deadline
        if not self.disconnected:
            self._reap_timer = self.loop.call_later(self.state.settings.write_timeout_s + self.close_timeout,
                                                    self._reap)  # fmt: skip

    def _reap(self) -> None:
        self._reap_timer = None
        if not self.disconnected:
            self._write_timeout()

    def handle_ping(self) -> None:
        now = time.monotonic()
        self._ping_tokens = min(self._ping_burst, self._ping_tokens + (now - self._ping_at) * self._ping_rate)
        self._ping_at = now
        if self._ping_tokens < 1:
            self._policy_close(f"more than {self._ping_rate:g} pings per second")
            return
        self._ping_tokens -= 1
        super().handle_ping()

    def _policy_close(self, reason: str) -> None:
        if self.close_sent or self.transport.is_closing():
            return
        self.state.metrics.connections_closed.inc(reason="ws_ping_flood")
        log.info("closing a WebSocket from %s: %s", self.client, reason)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1008, "reason": reason})
        self.conn.send_close(1008, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.abort)

    def _write_timeout(self) -> None:
        self._write_timer = None
        if self.disconnected:
            return
        self.state.metrics.connections_closed.inc(reason="write_timeout")
        log.info("closing a WebSocket from %s: it read nothing for %g s", self.client,
                 self.state.settings.write_timeout_s)
        self.transport.abort()  # close() would wait for the unread buffer to drain

    def _cancel_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None


def guarded_protocol(state) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn's ``http=`` option, bound to the app's settings and metrics."""
    return type("QttsH11Protocol", (GuardedH11Protocol,), {"state": state})


def guarded_ws_protocol(state) -> type[GuardedWebSocketProtocol]:
    """The protocol class for uvicorn's ``ws=`` option, bound to the app's settings and metrics."""
    return type("QttsWebSocketProtocol", (GuardedWebSocketProtocol,), {"state": state})
