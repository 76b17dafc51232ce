"""onnxruntime sessions: idle workers spin a bounded time (QTTS_SPIN_US), never onnxruntime's unbounded default."""

from __future__ import annotations

import pytest

from qtts.backends.onnx import SPIN_ENV, SPIN_US, session_options
from qtts.errors import InputError


def _entries(so) -> tuple[str, str]:
    return (so.get_session_config_entry("session.intra_op.allow_spinning"),
            so.get_session_config_entry("session.intra_op.spin_duration_us"))  # fmt: skip


def test_default_spin_is_bounded(monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    assert _entries(session_options(2)) == ("1", str(SPIN_US))
    assert 0 < SPIN_US <= 20  # a long spin steals the cores from the next session and other processes


@pytest.mark.parametrize(("value", "want"), [("0", ("0", "0")), (" 50 ", ("1", "50"))])
def test_env_sets_the_bound(monkeypatch, value, want):
    monkeypatch.setenv(SPIN_ENV, value)
    assert _entries(session_options(2)) == want


@pytest.mark.parametrize("value", ["-5", "5us", "1.5"])
def test_a_bad_bound_is_named(monkeypatch, value):
    monkeypatch.setenv(SPIN_ENV, value)
    with pytest.raises(InputError, match=f"{SPIN_ENV}=.*whole number of microseconds"):
        session_options(2)


def test_unbounded_spinning_on_request(monkeypatch):
    monkeypatch.delenv(SPIN_ENV, raising=False)
    so = session_options(2, spinning=True)
    for key in ("session.intra_op.allow_spinning", "session.intra_op.spin_duration_us"):
        with pytest.raises(RuntimeError):  # not set: onnxruntime's default (spinning, unbounded)
            so.get_session_config_entry(key)
