"""A raw WebSocket client over a plain socket, for clients no library lets you be: one that stops
reading (a tiny receive buffer), floods pings, or sends frames faster than it reads."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time

OP_TEXT, OP_CLOSE, OP_PING = 0x1, 0x8, 0x9


def frame(opcode: int, payload: bytes) -> bytes:
    """One final, masked client frame."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def text(obj) -> bytes:
    return frame(OP_TEXT, json.dumps(obj).encode())


def connect(host: str, port: int, path: str = "/v1/audio/speech/stream", rcvbuf: int | None = None,
            headers: dict | None = None, timeout: float = 10.0,
            host_header: str | None = None) -> tuple[socket.socket, bytes]:
    """(socket, the handshake response head) after a WebSocket upgrade request."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    host_header = host_header or f"{host}:{port}"
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return sock, head


def read_until_closed(sock: socket.socket, deadline_s: float) -> tuple[bytes, bool]:
    """(everything read, whether the server closed the connection) within ``deadline_s``."""
    data, end = b"", time.monotonic() + deadline_s
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def close_code(data: bytes) -> int | None:
    """The code of the first close frame among the server frames in ``data`` (None: none)."""
    i = 0
    while i + 2 <= len(data):
        op, n = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if n == 126:
            n, i = struct.unpack("!H", data[i : i + 2])[0], i + 2
        elif n == 127:
            n, i = struct.unpack("!Q", data[i : i + 8])[0], i + 8
        if op == OP_CLOSE and n >= 2:
            return struct.unpack("!H", data[i : i + 2])[0]
        i += n
    return None
