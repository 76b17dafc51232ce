"""The attacks of the second probe (issue 38) for ``benchmarks/soak.py --attackers``, mixed into
:class:`soak_attackers.Attackers` (which owns the plumbing: ``_sock``, ``_ws``, ``_until_closed``).

Each returns True when the server answered as documented (docs/operations.md, "What each attack
gets"): a FLAC client that hangs up (the slot is freed: the good clients' figures show it),
X-Forwarded-For that must buy neither sessions nor queue places, Content-Length with
Transfer-Encoding (400, closed), a Host with userinfo (403), an upload past the per-address
connection cap (a readable 503), and on Wyoming: one address's idle sockets (refused past its
share) and three 4,096-character requests that are never read (dropped after the write deadline,
holding the engine one piece at a time).
"""

from __future__ import annotations

import json
import threading
import time

ROUND2 = ["flac_hangup", "xff_sessions", "xff_queue", "framing", "over_cap_upload"]
ROUND2_WYOMING = ["wy_idle_many", "wy_long"]
LONG_4K = ("A long request that this client sends and never reads, over and over. " * 60)[:4096]


class Round2Attacks:
    def _post(self, body: dict, headers: str = "") -> bytes:
        data = json.dumps(body).encode()
        return (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json"
                f"\r\n{headers}Content-Length: {len(data)}\r\n\r\n").encode() + data

    def _flac_hangup(self) -> bool:
        """A long FLAC answer (every other time as SSE) and a hang-up 0.5 s later."""
        self.local.flac = not getattr(self.local, "flac", False)
        body = {"input": LONG_4K[:1500], "voice": self.speaker, "response_format": "flac",
                "stream_format": "sse" if self.local.flac else "audio"}
        s = self._sock()
        s.sendall(self._post(body))
        self.stop.wait(0.5)
        s.close()
        return True

    def _xff_sessions(self) -> bool:
        """Five sessions, each with its own X-Forwarded-For, from 127.0.0.1 (uvicorn alone trusts the
        header from there): still one client, three refused."""
        import select

        self.local.addr = "127.0.0.1"
        held = []
        try:
            for i in range(5):
                held.append(self._ws(headers=f"X-Forwarded-For: 10.66.0.{i}\r\n")[0])
            data, end = {s: b"" for s in held}, time.monotonic() + 10
            while time.monotonic() < end and sum(b"too_many_sessions" in d for d in data.values()) < 3:
                for s in select.select(held, [], [], 0.5)[0]:
                    data[s] += s.recv(4096) or b" closed"
            return sum(b"too_many_sessions" in d for d in data.values()) >= 3
        except OSError:
            return False
        finally:
            for s in held:
                s.close()

    def _xff_queue(self) -> bool:
        """Four requests at once from 127.0.0.1, each with its own X-Forwarded-For: each is answered
        200 or 429 (one client's requests, queued by the fair share), never more than that."""
        import httpx

        self.local.addr = "127.0.0.1"
        statuses, addr = [], self.local.addr  # (a thread-local: the request threads have none)

        def one(i: int) -> None:
            with httpx.Client(transport=httpx.HTTPTransport(local_address=addr), timeout=120) as c:
                r = c.post(f"http://{self.host}:{self.port}/v1/audio/speech", headers={"X-Forwarded-For": f"10.67.0.{i}"},
                           json={"input": LONG_4K[:200], "voice": self.speaker, "response_format": "pcm"})
                statuses.append(r.status_code)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        return len(statuses) == 4 and set(statuses) <= {200, 429}

    def _framing(self) -> bool:
        """Content-Length with Transfer-Encoding: one 400, then closed (the request behind it is
        not answered); a Host with userinfo: 403."""
        s = self._sock()
        s.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                  f"GET /health HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        data = self._read_all(s)
        s = self._sock()
        s.sendall(f"GET /health HTTP/1.1\r\nHost: {self.host}:{self.port}@evil.example\r\n\r\n".encode())
        host = self._read_all(s)
        return data.startswith(b"HTTP/1.1 400 ") and data.count(b"HTTP/1.1 ") == 1 and host.startswith(b"HTTP/1.1 403")

    def _read_all(self, s) -> bytes:
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        finally:
            s.close()
        return data

    def _over_cap_upload(self) -> bool:
        """64 idle connections (the per-address cap), then a 1 MB request: it is sent in full and
        its 503 read to a clean end (no reset)."""
        held = []
        try:
            for _ in range(64):
                held.append(self._sock())
            time.sleep(0.2)
            s = self._sock()
            s.sendall(self._post({"input": "x" * 1_000_000}))
            return self._read_all(s).startswith(b"HTTP/1.1 503 ")
        finally:
            for s in held:
                s.close()

    def _wy_idle_many(self) -> bool:
        """16 idle Wyoming sockets from one address: past its share (8) they get too_many_connections."""
        held, refused = [], 0
        try:
            for _ in range(16):
                held.append(self._sock(self.wyoming_port))
            for s in held:
                s.settimeout(0.3)
                try:
                    refused += b"too_many_connections" in s.recv(4096)
                except TimeoutError:
                    pass
        finally:
            self.stop.wait(2)
            for s in held:
                s.close()
        return refused >= 8

    def _wy_long(self) -> bool:
        """Three synthesize events of 4,096 characters, nothing read: dropped after the write deadline."""
        s = self._sock(self.wyoming_port, rcvbuf=4096)
        s.sendall((json.dumps({"type": "synthesize", "data": {"text": LONG_4K}}).encode() + b"\n") * 3)
        return self._until_closed(s, 120)
