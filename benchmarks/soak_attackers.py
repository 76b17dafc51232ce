"""Hostile clients for ``benchmarks/soak.py --attackers``: one of each kind of the 2026-12-01 probe
and of the 2026-12-04 one (``soak_attackers_r2.py``; docs/operations.md, "What each attack gets"),
each cycling in its own thread until the soak ends.

Each kind connects from its own address 127.0.0.N (Linux routes all of 127/8 to loopback), so
the per-address connection cap one runs into is neither the good clients' nor another
attacker's (in real life an attacker has its own address). :func:`run_process` runs them in a
process of their own, so their Python loops do not take the server's GIL. Each attack has an expected outcome (closed, refused, capped); anything else is
recorded as ``unexpected``. A Wyoming attacker needs ``wyoming_port``.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time

from soak_attackers_r2 import ROUND2, ROUND2_WYOMING, Round2Attacks

ATTACKER_NET = "127.0.0."
LONG = "This is a long sentence that the attacker asks for and never reads. " * 8


def _frame(opcode: int, payload: bytes) -> bytes:
    mask, n = os.urandom(4), len(payload)
    head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
                                     if n < 65536 else bytes([0x80 | 127]) + struct.pack("!Q", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _text(obj) -> bytes:
    return _frame(0x1, (obj if isinstance(obj, str) else json.dumps(obj)).encode())


class Attackers(Round2Attacks):
    """The attacker threads (module docstring); ``report()`` after ``stop`` is set."""

    def __init__(self, host: str, port: int, stop: threading.Event, voices_dir: str | None = None,
                 wyoming_port: int | None = None, speaker: str = "vivian"):
        self.host, self.port, self.stop, self.voices_dir = host, port, stop, voices_dir
        self.wyoming_port, self.speaker = wyoming_port, speaker
        self.session = {"type": "session.update", "session": {"voice": speaker, "response_format": "pcm"}}
        self.counts: dict[str, int] = {}
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        kinds = ["ws_stall", "ws_idle", "ws_trickle", "ws_sessions", "ws_flood", "ws_pings", "ws_tiny_deltas",
                 "ws_frames", "many_sockets", "origin", "voices", "bad_json"]
        kinds += ROUND2 + (["wy_stall", "wy_malformed"] + ROUND2_WYOMING if wyoming_port else [])
        self.local = threading.local()
        self.threads = [threading.Thread(target=self._loop, args=(k, i), name=f"attacker-{k}", daemon=True)
                        for i, k in enumerate(kinds)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float = 60.0) -> None:
        for t in self.threads:
            t.join(timeout)

    def report(self) -> dict:
        return {"attacks": dict(self.counts), "unexpected": len(self.unexpected), "unexpected_samples": self.unexpected[:20]}

    def _loop(self, kind: str, index: int) -> None:
        self.local.addr = f"{ATTACKER_NET}{2 + index}"
        attack = getattr(self, "_" + kind)
        while not self.stop.is_set():
            try:
                ok = attack()
            except OSError as exc:  # a reset is how several of these end
                ok = not isinstance(exc, ConnectionRefusedError)
            with self.lock:
                self.counts[kind] = self.counts.get(kind, 0) + 1
                if not ok and len(self.unexpected) < 200:
                    self.unexpected.append(kind)
            self.stop.wait(0.5)

    # -- plumbing --------------------------------------------------------------------------------
    def _sock(self, port: int | None = None, rcvbuf: int | None = None) -> socket.socket:
        s = socket.socket()
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.bind((self.local.addr, 0))
        s.settimeout(10)
        s.connect((self.host, port or self.port))
        return s

    def _ws(self, rcvbuf: int | None = None, origin: str | None = None, headers: str = "") -> tuple[socket.socket, bytes]:
        s = self._sock(rcvbuf=rcvbuf)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = (f"Origin: {origin}\r\n" if origin else "") + headers
        s.sendall((f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head and (c := s.recv(1)):
            head += c
        return s, head

    def _closed_within(self, s: socket.socket, seconds: float, read: bool = True) -> bool:
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end and not self.stop.is_set():
                s.settimeout(0.5)
                try:
                    if read and not s.recv(1 << 16):
                        return True
                    if not read:
                        time.sleep(0.5)
                        s.send(b"")
                except TimeoutError:
                    continue
            return self.stop.is_set()
        except OSError:
            return True
        finally:
            s.close()

    # -- the attacks -------------------------------------------------------------------------------
    def _until_closed(self, s, seconds: float) -> bool:
        """Read nothing; wait (at most ``seconds``) until the server closes ``s``, then close it."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.stop.is_set():
            time.sleep(1)
            try:
                s.setblocking(False)
                if s.recv(1, socket.MSG_PEEK) == b"":
                    break  # closed (the data already in our buffer stays unread)
            except BlockingIOError:
                continue
            except OSError:
                break
        s.close()
        return True

    def _ws_stall(self) -> bool:
        """A 4 KiB receive buffer, a long answer, nothing read: dropped after the write timeout."""
        s, _ = self._ws(rcvbuf=4096)
        s.sendall(_text(self.session) + _text({"type": "text.delta", "delta": LONG}) + _text({"type": "text.done"}))
        return self._until_closed(s, 180)

    def _ws_idle(self) -> bool:
        """session.update, then empty deltas and unknown messages every second: idles out."""
        s, _ = self._ws()
        s.sendall(_text(self.session))
        end = time.monotonic() + 120
        try:
            while time.monotonic() < end and not self.stop.is_set():
                s.sendall(_text({"type": "text.delta", "delta": ""}) + _text({"type": "nope"}))
                time.sleep(1)
        except OSError:
            return True
        finally:
            s.close()
        return self.stop.is_set()

    def _read_for(self, s: socket.socket, seconds: float) -> int:
        """Bytes read from ``s`` within ``seconds`` (or until it closes)."""
        got, end = 0, time.monotonic() + seconds
        s.settimeout(0.5)
        while time.monotonic() < end and not self.stop.is_set():
            try:
                chunk = s.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            got += len(chunk)
        return got

    def _ws_trickle(self) -> bool:
        """session.update, then one word every 0.5 s for 60 s, reading: the session is served (its
        utterances are admitted like requests) but never holds the worker others wait for."""
        s, _ = self._ws()
        got, end = 0, time.monotonic() + 60
        try:
            s.sendall(_text(self.session))
            while time.monotonic() < end and not self.stop.is_set():
                s.sendall(_text({"type": "text.delta", "delta": "a "}))
                got += self._read_for(s, 0.5)
            s.sendall(_text({"type": "text.done"}))
            got += self._read_for(s, 60)
        except OSError:
            pass
        finally:
            s.close()
        return got > 0 or self.stop.is_set()

    def _ws_sessions(self) -> bool:
        """Three sessions at once from one address: one (the third, unless the last round's are still
        closing) is closed with too_many_sessions."""
        import select

        held = [self._ws()[0] for _ in range(3)]
        try:
            for s in held:
                s.sendall(_text(self.session))
            data, end = {s: b"" for s in held}, time.monotonic() + 10
            while time.monotonic() < end and not any(d and b"too_many_sessions" in d for d in data.values()):
                for s in select.select([s for s in held if data[s] is not None], [], [], 0.5)[0]:
                    chunk = s.recv(4096)
                    data[s] = data[s] + chunk if chunk else (data[s] if b"too_many" in data[s] else None)
            return any(d and b"too_many_sessions" in d for d in data.values())
        except OSError:
            return False
        finally:
            for s in held:
                s.close()

    def _ws_flood(self) -> bool:
        s, _ = self._ws()
        try:
            s.sendall(_text({"type": "nope"}) * 2000)
        except OSError:
            return True
        return self._closed_within(s, 30)

    def _ws_pings(self) -> bool:
        s, _ = self._ws(rcvbuf=4096)
        ping, end = _frame(0x9, b"p" * 125) * 64, time.monotonic() + 5
        try:
            while time.monotonic() < end:
                s.sendall(ping)
        except OSError:
            return True
        return self._closed_within(s, 60, read=False)

    def _ws_tiny_deltas(self) -> bool:
        """2,000 one-character deltas at 150/s (under the rate limit), then the answer is read."""
        s, _ = self._ws()
        s.sendall(_text(self.session))
        for i, ch in enumerate(("hello world " * 200)[:2000]):
            s.sendall(_text({"type": "text.delta", "delta": ch}))
            if i % 15 == 14:
                time.sleep(0.1)
        s.sendall(_text({"type": "text.done"}))
        return self._closed_within(s, 300)

    def _ws_frames(self) -> bool:
        """Many short sentences with max_frames=4: the whole session stops at 4 frames."""
        s, _ = self._ws()
        cfg = {"type": "session.update", "session": {**self.session["session"], "max_frames": 4}}
        s.sendall(_text(cfg) + _text({"type": "text.delta", "delta": "a. " * 1000}) + _text({"type": "text.done"}))
        data, end = b"", time.monotonic() + 120
        try:
            while time.monotonic() < end and (chunk := s.recv(1 << 16)):
                data += chunk
        except OSError:
            pass
        s.close()
        return len(data) < 4 * 1920 * 2 + 4096

    def _many_sockets(self) -> bool:
        """70 silent connections from one address: past the per-address cap they get 503."""
        held, refused = [], 0
        try:
            for _ in range(70):
                held.append(self._sock())
            for s in held[-3:]:
                s.settimeout(5)
                with_data = s.recv(200)
                refused += with_data.startswith(b"HTTP/1.1 503")
        except OSError:
            refused += 1
        finally:
            self.stop.wait(3)
            for s in held:
                s.close()
        return refused > 0

    def _origin(self) -> bool:
        import httpx

        s, head = self._ws(origin="http://evil.example")
        s.close()
        with httpx.Client(transport=httpx.HTTPTransport(local_address=self.local.addr), timeout=30) as c:
            r = c.post(f"http://{self.host}:{self.port}/v1/audio/speech", headers={"Origin": "http://evil.example"},
                       json={"input": "hi"})
            h = c.get(f"http://{self.host}:{self.port}/health", headers={"Host": "evil.example"})
        return head.startswith(b"HTTP/1.1 403") and r.status_code == 403 and h.status_code == 403

    def _voices(self) -> bool:
        """Links, dangling links and directories appear and vanish while the list is read."""
        import httpx

        base = f"http://{self.host}:{self.port}"
        ok = True
        if self.voices_dir:
            link = os.path.join(self.voices_dir, "attack.voice")
            for make in (lambda: os.symlink("/nonexistent", link), lambda: os.mkdir(link)):
                try:
                    make()
                    ok &= httpx.get(base + "/v1/voices", timeout=30).status_code == 200
                    ok &= httpx.delete(base + "/v1/voices/attack", timeout=30).status_code in (200, 404, 409)
                finally:
                    if os.path.isdir(link) and not os.path.islink(link):
                        os.rmdir(link)
                    elif os.path.lexists(link):
                        os.unlink(link)
        ok &= httpx.get(base + "/v1/voices", timeout=30).status_code == 200
        return ok

    def _bad_json(self) -> bool:
        s, _ = self._ws()
        s.sendall(_text(self.session) + _text('{"type": "text.delta", "delta": ' + "[" * 5000 + "]" * 5000 + "}")
                  + _text({"type": "session.update", "session": {"voice": "v" * 20000}}))
        return self._closed_within(s, 60)

    def _wy_stall(self) -> bool:
        s = self._sock(self.wyoming_port, rcvbuf=4096)
        line = {"type": "synthesize", "data": {"text": LONG}}
        s.sendall(json.dumps(line).encode() + b"\n")
        return self._until_closed(s, 120)

    def _wy_malformed(self) -> bool:
        ok = True
        for line in (b"not json\n", b'{"type": 5}\n', b'{"type": "synthesize", "data": {"text": 123}}\n',
                     b'{"type": "synthesize", "data_length": -1}\n'):
            s = self._sock(self.wyoming_port)
            s.sendall(line)
            data = b""
            try:
                while chunk := s.recv(4096):
                    data += chunk
            except OSError:
                pass
            s.close()
            ok &= b'"error"' in data
        return ok


def run_process(host: str, port: int, voices_dir=None, wyoming_port=None, speaker="vivian", nice: int = 19):
    """Start the attackers in a separate process at niceness ``nice`` (an attacker runs on a
    machine of its own: on the soak's box its Python loops should not take the CPU the server
    needs; 0: the same priority as the server); returns ``finish()``, which stops them and
    returns their report, with the CPU seconds their process used (``cpu_s``)."""
    import multiprocessing

    import psutil

    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_process_entry, args=(host, port, voices_dir, wyoming_port, speaker, stop, out, nice),
                       daemon=True)
    proc.start()

    def finish() -> dict:
        times = psutil.Process(proc.pid).cpu_times()
        stop.set()
        try:
            return {**out.get(timeout=240), "cpu_s": round(times.user + times.system, 1)}
        finally:
            proc.join(30)

    return finish


def _process_entry(host, port, voices_dir, wyoming_port, speaker, stop, out, nice=0) -> None:
    if nice:
        os.nice(nice)
    local_stop = threading.Event()
    attackers = Attackers(host, port, local_stop, voices_dir=voices_dir, wyoming_port=wyoming_port, speaker=speaker)
    attackers.start()
    stop.wait()
    local_stop.set()
    attackers.join()
    out.put(attackers.report())
