"""Which browsers and Host names may use the server: the origin policy (docs/operations.md).

A web page the user visits can send requests to a server on the user's machine: a cross-origin
"simple" POST (a multipart upload), a WebSocket (browsers never block those by origin), or
anything at all after DNS rebinding points the page's own name at 127.0.0.1. So:

* **Host.** Every request must name this server in its ``Host`` header: a loopback name
  (``localhost``, ``*.localhost``, ``127.0.0.1``, ``::1``), the bound address, the machine's host
  name, any IP literal when the server listens on all interfaces (``0.0.0.0`` / ``::``; an IP
  literal is never a rebinding), or a name given with ``--allow-host`` (``*``: any). Others get
  403. A request without ``Host`` (HTTP/1.0) is not a browser's and passes.
* **Origin.** A WebSocket upgrade or a state-changing request (POST, PUT, PATCH, DELETE) that
  carries an ``Origin`` header must come from the server's own origin (the page at ``/``, whose
  origin names the same host and port as the request's ``Host``) or one given with
  ``--allow-origin`` (``*``: any); others get 403 (the WebSocket handshake too). Requests
  without ``Origin`` (curl, the openai client, Home Assistant) are not from a web page and pass.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from ..errors import InputError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost", "ip6-loopback"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
_HOST_RE = re.compile(r"[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]|[0-9A-Fa-f:.]{2,45}")
#: a whole Host header: a name or an IP literal, then an optional port of digits; nothing else
_HOST_HEADER_RE = re.compile(rf"(?:{_HOST_RE.pattern})(?::[0-9]{{1,5}})?")
_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def _split_host(value: str) -> tuple[str, str]:
    """``Host`` header (or netloc) -> (lowercase name without brackets or final dot, port or '')."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else ""
    if value.count(":") == 1:
        name, _, port = value.partition(":")
        return name.rstrip("."), port
    return value.rstrip("."), ""


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def normalize_origin(origin: str) -> str | None:
    """``scheme://name[:port]`` lowercased, default port dropped; None when it is not one."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") \
            or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    name, port = _split_host(parts.netloc)
    if not name or port == _DEFAULT_PORTS[parts.scheme]:
        port = ""
    host = f"[{name}]" if ":" in name else name
    return f"{parts.scheme}://{host}{':' + port if port else ''}"


def check_allow_lists(origins, hosts) -> None:
    """InputError naming the first ``--allow-origin`` / ``--allow-host`` value that is not one."""
    for o in origins:
        if o != "*" and normalize_origin(o) is None:
            raise InputError(f"--allow-origin {o!r}: give an origin as scheme://host[:port] (e.g. "
                             "https://tts.example.com), or * for any")
    for h in hosts:
        if h != "*" and not _HOST_RE.fullmatch(h):
            raise InputError(f"--allow-host {h!r}: give a host name or address without a port (e.g. "
                             "tts.example.com), or * for any")


class OriginPolicy:
    """The checks of the module docstring for one server's settings."""

    def __init__(self, settings):
        self.any_origin = "*" in settings.allow_origins
        self.origins = {normalize_origin(o) for o in settings.allow_origins if o != "*"}
        self.any_host = "*" in settings.allow_hosts
        self.wildcard = settings.host in WILDCARD_BINDS
        names = {_split_host(h)[0] for h in settings.allow_hosts if h != "*"}
        names.add(_split_host(settings.host)[0])
        try:
            machine = socket.gethostname().lower()
        except OSError:
            machine = ""
        if machine:
            names.update({machine, machine + ".local"})
        self.hosts = frozenset(LOOPBACK_NAMES | names)

    def host_ok(self, host: str | None) -> bool:
        if not host:
            return True
        if not _HOST_HEADER_RE.fullmatch(host.strip()):
            return False  # userinfo (name@host), a port that is not digits, spaces: not a Host (RFC 9110 7.2)
        if self.any_host:
            return True
        name, _ = _split_host(host)
        return name in self.hosts or name.endswith(".localhost") or (self.wildcard and _is_ip(name))

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        if origin is None or self.any_origin:
            return True
        normal = normalize_origin(origin)
        if normal is None:
            return False  # "null" (a sandboxed frame, a file) or garbage
        if normal in self.origins:
            return True
        if not host:
            return False
        name, port = _split_host(host)
        own = normal.split("://", 1)[1]
        return own in (f"{name}:{port}" if port else name, name if port in ("80", "443") else None)

    def refusal(self, scope) -> tuple[str, str] | None:
        """(code, message) of why ``scope`` (an ASGI http or websocket scope) is refused; None when
        it may go on."""
        headers = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host, origin = headers.get("host"), headers.get("origin")
        if not self.host_ok(host):
            shown = host[:80]
            return "forbidden_host", (f"Host {shown!r} does not name this server (a DNS rebinding guard); reach it as localhost or "
                    f"127.0.0.1, or start it with --allow-host {_split_host(shown)[0] or 'NAME'} (the name a "
                    "reverse proxy or the LAN uses)")
        if scope["type"] == "websocket" or scope.get("method") in STATE_CHANGING:
            if not self.origin_ok(origin, host):
                shown = origin[:80]
                return "forbidden_origin", (f"a web page at {shown!r} may not use this server (not its origin); start the server "
                        f"with --allow-origin {shown} to allow it")
        return None
