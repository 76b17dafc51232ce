"""Run the app under uvicorn: in the foreground (``qtts serve``) or in a thread (tests, soak).

Both use :mod:`qtts.server.protocol` (header/body/write timeouts, connection cap).
"""

from __future__ import annotations

import socket
import threading
import time

from ..errors import QttsError, require


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 = a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise QttsError(f"cannot listen on {host}:{port}: {exc}; choose another --port") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


#: largest WebSocket message the protocol accepts (bigger ones are closed with 1009 before the app
#: sees them); the app answers a text.delta over ws_max_message_chars itself, with an error event
WS_MAX_BYTES = 4 * 1024 * 1024


def _config(app, log_level: str, access_log: bool):
    """uvicorn settings: the guarded h11 protocol (timeouts, connection cap) from the app's settings,
    and the guarded ``websockets`` (sans-I/O) protocol for the live speech WebSocket."""
    uvicorn = require("uvicorn", "serve", "the HTTP server")
    require("websockets", "serve", "the WebSocket endpoint /v1/audio/speech/stream")
    from .protocol import guarded_protocol, guarded_ws_protocol

    state = app.state.qtts
    proxies = list(state.settings.forwarded_allow_ips)  # who is a client (qtts.server.clients): none by default
    return uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                          proxy_headers=bool(proxies), forwarded_allow_ips=proxies or [],
                          timeout_graceful_shutdown=5, http=guarded_protocol(state),
                          timeout_keep_alive=state.settings.keep_alive_s, ws=guarded_ws_protocol(state),
                          ws_max_size=WS_MAX_BYTES)


class ServerThread:
    """uvicorn serving ``app`` on ``host`` (loopback) from a background thread.

    ``with ServerThread(app) as srv: httpx.get(srv.url + "/health")``.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self.sock = bind_socket(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(_config(app, log_level, access_log=False))
        self.server.install_signal_handlers = lambda: None  # not in the main thread
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="qtts-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise QttsError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_forever(app, host: str, port: int, log_level: str = "info") -> None:
    """Blocking: serve until SIGINT/SIGTERM."""
    uvicorn = require("uvicorn", "serve", "the HTTP server")
    sock = bind_socket(host, port)
    try:
        uvicorn.Server(_config(app, log_level, access_log=False)).run(sockets=[sock])
    finally:
        sock.close()
