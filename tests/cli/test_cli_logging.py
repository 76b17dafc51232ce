"""CLI log handlers follow sys.stderr (a swapped-and-closed stderr must not break later records)."""

from __future__ import annotations

import io
import logging
import sys

from qtts.cli.common import StderrHandler, add_stderr_handler
from qtts.cli.serve import _access_log


def test_handler_writes_to_the_current_stderr(monkeypatch):
    log = logging.getLogger("qtts.test.stderr_handler")
    log.propagate = False
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    add_stderr_handler(log, "%(message)s")
    add_stderr_handler(log, "%(message)s")  # idempotent
    try:
        assert sum(isinstance(h, StderrHandler) for h in log.handlers) == 1
        log.warning("one")
        monkeypatch.setattr(sys, "stderr", second)
        first.close()  # what pytest's capture does at the end of a test
        errors = []
        monkeypatch.setattr(logging, "raiseExceptions", True)
        monkeypatch.setattr(StderrHandler, "handleError", lambda self, record: errors.append(record))
        log.warning("two")
        assert second.getvalue() == "two\n" and errors == []
    finally:
        log.handlers.clear()


def test_access_log_added_once():
    access = logging.getLogger("qtts.server.access")
    before = list(access.handlers)
    try:
        _access_log()
        _access_log()
        assert sum(isinstance(h, StderrHandler) for h in access.handlers) == 1
    finally:
        access.handlers[:] = before


def test_plan_build_progress_is_info_and_the_cli_shows_it(caplog):
    """A plan build's progress is INFO (not a warning); the CLI's default verbosity still shows it,
    as plain lines, and hides other INFO records."""
    import subprocess

    from qtts.plans.build import BuildProgress

    with caplog.at_level(logging.INFO, logger="qtts.plans.build"):
        progress = BuildProgress("the 'fast' plan", 10, tty=False)
        progress.phase("talker")
        progress.finish()
    levels = {r.levelno for r in caplog.records if r.name == "qtts.plans.build"}
    assert levels == {logging.INFO}, caplog.text
    script = ("import logging; from qtts.cli.common import setup_logging; setup_logging(0); "
              "logging.getLogger('qtts.plans.build').info('qtts: building the plan'); "
              "logging.getLogger('qtts.plans.cache').info('not shown'); "
              "logging.getLogger('qtts.plans.cache').warning('shown')")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stderr == "qtts: building the plan\nWARNING qtts.plans.cache: shown\n"
