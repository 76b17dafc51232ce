"""Real server processes for the attack tests: ``qtts serve`` and ``qtts wyoming`` run as
``sys.executable -m qtts`` on a free loopback port, so the server is what a user runs (its own
event loop, its own GIL, the CLI's defaults) and ``PYTHONPATH`` picks the code under test (an
older checkout's ``src`` runs the same tests against the code before a fix). stderr goes to a file
(a pipe that nobody reads would block a chatty server) and its tail is shown when a start fails.
Clients bind their own loopback source address (Linux routes all of 127/8 to loopback), so the
server's per-address rules see an attacker (127.0.0.1) and a good client (127.0.0.2) apart."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

ATTACKER, GOOD = "127.0.0.1", "127.0.0.2"
#: where the readiness checks come from: not the attacker's address, so a check connection that the
#: server has not closed yet never counts against the attacker's per-address share
PROBE = "127.0.0.3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    log_path: str
    host: str = "127.0.0.1"
    output: str = ""  # what it wrote (stdout and stderr), once it has stopped

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/audio/speech/stream"

    def log_tail(self, chars: int = 3000) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()[-chars:]


def _ready(kind: str, port: int) -> bool:
    try:
        if kind == "serve":
            with httpx.Client(transport=httpx.HTTPTransport(local_address=PROBE), timeout=5) as client:
                return client.get(f"http://127.0.0.1:{port}/health").status_code == 200
        with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(PROBE, 0)):
            return True
    except (httpx.TransportError, OSError):
        return False


@contextlib.contextmanager
def served(kind: str, model: str, *args: str, ready_s: float = 180.0, env: dict | None = None) -> Iterator[Served]:
    """``qtts serve`` (``kind="serve"``, ready when /health answers 200) or ``qtts wyoming``
    (ready when it accepts a connection) on ``model`` with the CLI ``args`` and ``env`` (default:
    this process's); stopped with SIGTERM (killed after 30 s) when the block ends, then its output
    is in ``Served.output``."""
    port = free_port()
    where = ["--port", str(port), "--no-access-log"] if kind == "serve" else ["--uri", f"tcp://127.0.0.1:{port}"]
    cmd = [sys.executable, "-m", "qtts", kind, "--model", model, "--threads", "1", *where, *args]
    log = tempfile.NamedTemporaryFile("w", prefix=f"qtts-{kind}-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ) if env is None else env)
    srv = Served(proc, port, log.name)
    try:
        deadline = time.monotonic() + ready_s
        while not _ready(kind, port):
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"{' '.join(cmd)} did not start:\n{srv.log_tail()}"
            time.sleep(0.1)
        yield srv
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()
        srv.output = srv.log_tail(1 << 20)
        os.unlink(log.name)
