"""Who is a client: the one definition every per-address limit uses (docs/operations.md, "Who is a client").

A client is the address of the TCP peer, unless that peer is a reverse proxy the operator named
(``qtts serve --forwarded-allow-ips``): then it is the address that proxy forwards in
``X-Forwarded-For`` (uvicorn's proxy-headers middleware, given exactly that list, rewrites the
ASGI ``client``; :func:`qtts.server.worker.address` reads it). Nobody is trusted by default, so a
client cannot name itself anew in a header to buy more sessions, queue places or uploads. The
connection caps count TCP connections, before any header: a named proxy's connections count
against the total cap only (it carries many clients). The Wyoming service has no proxy headers:
its client is always the TCP peer (:func:`peer_address`).
"""

from __future__ import annotations

import ipaddress

from ..errors import InputError

#: the client address of a Unix-socket or stdio peer (one local client)
LOCAL = "local"


def check_proxies(values) -> tuple[str, ...]:
    """``--forwarded-allow-ips`` values (IP addresses, networks like 10.0.0.0/8, ``*`` for any) as a
    tuple; InputError naming the first that is not one. A string is split at commas."""
    if isinstance(values, str):
        values = [v.strip() for v in values.split(",") if v.strip()]
    out = tuple(values)
    for value in out:
        if value == "*":
            continue
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise InputError(f"--forwarded-allow-ips {value!r}: give the reverse proxy's IP address or network "
                             "(127.0.0.1, 10.0.0.0/8), or * for any peer") from None
    return out


class Proxies:
    """Membership test for the named proxies (addresses and networks)."""

    def __init__(self, values: tuple[str, ...]):
        self.any = "*" in values
        self.networks = [ipaddress.ip_network(v, strict=False) for v in values if v != "*"]

    def __contains__(self, host: str | None) -> bool:
        if self.any:
            return True
        try:
            addr = ipaddress.ip_address(host or "")
        except ValueError:
            return False
        return any(addr in net for net in self.networks)


def peer_address(peername) -> str:
    """The client address of a socket peer name (``transport.get_extra_info('peername')``)."""
    if isinstance(peername, (tuple, list)) and peername:
        return str(peername[0])
    return LOCAL
