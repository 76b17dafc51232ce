"""One verifying SSL context for every httpx client the tests make.

The tests speak plain HTTP to servers on loopback, yet httpx builds a verifying SSL context for each
``httpx.Client()`` and each ``httpx.get`` / ``post`` / ``stream`` (it loads certifi's CA bundle:
~20 ms; ~2,000 clients a run, ~40 s of CPU in a py-spy profile of CI). :func:`share_default_context`
makes httpx build that default context once per process and hand the same one to every client that
asks for the default (``verify=True``, no client certificate); any other ``verify`` / ``cert`` goes
to httpx unchanged. An SSLContext may be shared by many connections and threads.
"""

from __future__ import annotations

import threading


def share_default_context() -> bool:
    """Install the shared default context into httpx's transport; False (and nothing changed) when
    this httpx does not build its context where this expects."""
    try:
        import httpx._transports.default as transport
    except ImportError:
        return False
    make = getattr(transport, "create_ssl_context", None)
    if make is None or getattr(make, "qtts_shared", False):
        return make is not None
    lock, made = threading.Lock(), []

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None:
            return make(verify=verify, cert=cert, trust_env=trust_env)
        with lock:
            if not made:
                made.append(make(verify=True, cert=None, trust_env=trust_env))
            return made[0]

    create_ssl_context.qtts_shared = True
    transport.create_ssl_context = create_ssl_context
    return True
