"""tests/support/http_clients.py: the tests' httpx clients share one default SSL context (conftest
installs it), and only the default one."""

from __future__ import annotations

import httpx._transports.default as transport

from support.http_clients import share_default_context


def test_default_clients_share_one_context_and_others_are_untouched():
    assert share_default_context(), (
        "this httpx builds its SSL context elsewhere: update support/http_clients.py"
    )
    assert transport.create_ssl_context.qtts_shared  # conftest installed it before any test ran
    shared = transport.create_ssl_context()
    assert transport.create_ssl_context(verify=True) is shared
    assert transport.create_ssl_context(verify=False) is not shared
    assert transport.create_ssl_context(verify=False).verify_mode != shared.verify_mode
