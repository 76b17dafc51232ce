"""Outermost ASGI middleware: request ids, body-size and content-type checks, request metrics,
JSON access log.

* Bodies larger than the route's limit get 413 before the app reads them (from Content-Length),
  or as soon as the streamed body passes the limit (chunked uploads without a length).
* The two POST routes get 415 before anything parses their body when the Content-Type is not
  the one they take (also when it is missing): JSON for speech, multipart for voice uploads.
* Whenever a response starts before the request body was read to its end (a 413, or any error
  raised before the route parsed the body), the rest of the body is read and dropped first, up
  to ``DRAIN_CAP`` bytes: closing a socket with unread bytes makes the kernel send a TCP reset,
  which can destroy the response before the client reads it.
* A request with both ``Content-Length`` and ``Transfer-Encoding`` (a request-smuggling shape) is
  answered 400 and its connection closed (RFC 9112 section 6.1).
* The origin policy (:mod:`qtts.server.origin`): a request whose ``Host`` does not name the
  server, or a WebSocket upgrade / state-changing request from another origin, gets 403 (the
  WebSocket handshake is refused with it) before any route runs.
* Every HTTP response carries ``X-Content-Type-Options: nosniff``.
* One access-log record per request on the ``qtts.server.access`` logger, as a JSON object:
  request id, method, path, route, status, duration, bytes sent, plus what the route added
  (frames, audio seconds, time to first audio, finish reason, cancelled).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import error_body
from .origin import OriginPolicy

access_log = logging.getLogger("qtts.server.access")
#: use with ``fullmatch`` (``$`` would also match before a final newline)
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: request methods counted by name in qtts_requests_total; any other (a client may send any token) is
#: "OTHER", so made-up methods cannot grow the metrics' label sets without bound
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
#: (method, path) -> the content type the route parses, and how to send it
CONTENT_TYPES = {
    ("POST", "/v1/audio/speech"): ("application/json", "send a JSON object with Content-Type: application/json"),
    ("POST", "/v1/voices"): ("multipart/form-data", "upload the reference audio as multipart/form-data with "
                             "a 'file' field"),
}
#: multipart framing and form fields on top of the audio file itself
UPLOAD_OVERHEAD = 64 * 1024
#: most bytes of a request body read and dropped before an early response; past it the server
#: answers at once, and the client may see a connection reset instead of the response
DRAIN_CAP = 32 * 1024 * 1024


class BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body too large: the limit is {limit} bytes")


class _Body:
    """The request body as the app reads it: counts bytes, enforces ``limit``, drains the rest."""

    def __init__(self, receive, headers: dict, limit: int):
        self._receive, self.limit, self.received = receive, limit, 0
        try:
            self.length = max(0, int(headers.get("content-length", "0") or 0))
        except ValueError:
            self.length = 0
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.done = self.length == 0 and not chunked
        # a client that sent "Expect: 100-continue" sends no body until the app first reads it
        self.unread_continue = headers.get("expect", "").lower() == "100-continue"

    async def receive(self):
        self.unread_continue = False
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.done = not message.get("more_body", False)
            if self.received > self.limit:
                raise BodyTooLarge(self.limit)
        elif message["type"] == "http.disconnect":
            self.done = True
        return message

    async def drain(self) -> None:
        """Read and drop what is left of the body (nothing when it is past ``DRAIN_CAP``)."""
        if self.length > DRAIN_CAP or self.unread_continue:
            self.done = True
        while not self.done and self.received <= DRAIN_CAP:
            message = await self._receive()
            self.received += len(message.get("body", b""))
            self.done = message["type"] != "http.request" or not message.get("more_body", False)


def _wrong_content_type(method: str, path: str, headers: dict) -> str | None:
    """The 415 message when ``path`` parses one content type and the request sent another."""
    want = CONTENT_TYPES.get((method, path))
    if want is None:
        return None
    got = headers.get("content-type", "").split(";")[0].strip().lower()
    if got == want[0]:
        return None
    return f"unsupported content type {got or 'none'!r}: {want[1]}"


class AccessMiddleware:
    def __init__(self, app, state):
        self.app = app
        self.state = state
        self.policy = OriginPolicy(state.settings)

    def _limit(self, scope) -> int:
        s = self.state.settings
        if scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/voices":
            return s.max_upload_bytes + UPLOAD_OVERHEAD
        return s.max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            refusal = self.policy.refusal(scope)
            if refusal is None:
                return await self.app(scope, receive, send)
            return await self._refuse_websocket(scope, receive, send, refusal)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        rid = headers.get("x-request-id", "")
        rid = rid if _REQUEST_ID_RE.fullmatch(rid) else uuid.uuid4().hex[:16]
        info = {"status": None, "bytes": 0}
        scope.setdefault("state", {})["access"] = extra = {}
        body = _Body(receive, headers, self._limit(scope))

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                await body.drain()
                info["status"] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"x-request-id", rid.encode())]
                if not any(k.lower() == b"x-content-type-options" for k, _ in message["headers"]):
                    message["headers"].append((b"x-content-type-options", b"nosniff"))
            elif message["type"] == "http.response.body":
                info["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self._dispatch(scope, headers, body, extra, send_wrapper)
        except BodyTooLarge as exc:
            if info["status"] is None:
                await self._reject(send_wrapper, 413, exc.detail)
        except Exception:
            if info["status"] is None:
                info["status"] = 500
            raise
        finally:
            self._finish(scope, info, extra, rid, t0)

    async def _dispatch(self, scope, headers: dict, body, extra: dict, send) -> None:
        """The app, or the refusal a request's framing, origin, size or content type earns."""
        wrong_type = _wrong_content_type(scope["method"], scope["path"], headers)
        refusal = self.policy.refusal(scope)
        if "content-length" in headers and "transfer-encoding" in headers:  # RFC 9112 6.1: then close
            extra["error"] = "Content-Length with Transfer-Encoding"
            await self._reject(send, 400, "a request may not carry both Content-Length and Transfer-Encoding "
                               "(RFC 9112 section 6.1); the connection is closed", "bad_framing")
        elif refusal is not None:
            extra["error"] = refusal[1][:200]
            await self._reject(send, 403, refusal[1], refusal[0])
        elif body.length > body.limit:
            await self._reject(send, 413, f"request body too large: {body.length} bytes; the limit is {body.limit} bytes")
        elif wrong_type:
            await self._reject(send, 415, wrong_type, "unsupported_media_type")
        else:
            await self.app(scope, body.receive, send)

    async def _reject(self, send, status: int, message: str, code: str | None = None) -> None:
        body = json.dumps(error_body(status, message, code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def _refuse_websocket(self, scope, receive, send, refusal: tuple[str, str]) -> None:
        """Refuse the handshake with 403 (the app never runs; the reason goes to the access log)."""
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008, "reason": refusal[0]})  # before accept: HTTP 403
        refusal = refusal[1]
        self.state.metrics.requests.inc(route=scope["path"] if scope["path"] == "/v1/audio/speech/stream"
                                        else "unmatched", method="WS", status="403")
        if self.state.settings.access_log:
            client = scope.get("client")
            access_log.info(json.dumps({"method": "WS", "path": scope["path"][:200], "status": 403,
                                        "client": f"{client[0]}:{client[1]}" if client else None,
                                        "error": refusal[:200]}, ensure_ascii=True))

    def _finish(self, scope, info: dict, extra: dict, rid: str, t0: float) -> None:
        route = scope.get("route")
        known = (scope["method"], scope["path"]) in CONTENT_TYPES  # answered here (413/415) before routing
        route_path = getattr(route, "path", None) or (scope["path"] if known else "unmatched")
        status = info["status"] or 499  # 499: the client went away before any response
        m = self.state.metrics
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        m.requests.inc(route=route_path, method=method, status=str(status))
        if status >= 500:
            m.errors.inc(route=route_path, kind=str(status))
        if not self.state.settings.access_log:
            return
        record = {"request_id": rid, "method": scope["method"][:32], "path": scope["path"][:200],
                  "route": route_path,
                  "status": status, "duration_ms": round(1000 * (time.perf_counter() - t0), 1),
                  "bytes_sent": info["bytes"]}
        client = scope.get("client")
        if client:
            record["client"] = f"{client[0]}:{client[1]}"
        for key in ("frames", "audio_s", "ttfa_s", "gen_s", "finish_reason", "cancelled", "error", "voice_id"):
            if key in extra:
                v = extra[key]
                record[key] = round(v, 4) if isinstance(v, float) else v
        access_log.info(json.dumps(record, ensure_ascii=True))
