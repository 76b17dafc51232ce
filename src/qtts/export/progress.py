"""Progress of a plan build (:mod:`qtts.backends.cache`): a bar with an ETA on a terminal, log lines
otherwise, and listeners (the server's ``/health`` reads "building plan, N %").

The exporter reports phases (:data:`PHASES`, with their share of the build time measured on a
full-size 0.6B export); inside a phase the percentage moves with the time the phase is expected to
take, never past its end, so the bar keeps moving during the long graph exports. The whole build is
expected to take :func:`expected_seconds` (the measured full-size exports took 104-106 s on a
2-core Zen 5 machine: a fixed part for tracing the graphs, and a part per GB of weights).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: exporter phases and their share of the build time (percent; measured on the full-size 0.6B)
PHASES = (("checkpoint", 4), ("tables", 6), ("text projection", 2), ("talker", 24), ("predictor", 12),
          ("batch graphs", 26), ("encoders", 10), ("vocoder", 16))  # fmt: skip
_TICK_S = 0.5


def expected_seconds(checkpoint_bytes: int) -> float:
    """A first guess of the build time: ~25 s of graph tracing plus ~19 s per GB of weights."""
    return 25.0 + 19.0 * checkpoint_bytes / 1e9


class BuildProgress:
    """Call :meth:`phase` as the export moves on and :meth:`finish` at the end; thread-safe.

    ``listeners`` get ``(percent, phase)`` on every tick; ``tty`` None: a bar when stderr is a terminal.
    """

    def __init__(self, what: str, expected_s: float, listeners: tuple[Callable, ...] = (), tty: bool | None = None):
        self.what, self.expected_s = what, max(float(expected_s), 1.0)
        self.listeners = tuple(listeners)
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._done, self._name, self._since = 0.0, "starting", self.t0
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="qtts-build-progress", daemon=True)
        log.warning("qtts: building %s (once; about %s expected)", what, _duration(self.expected_s))
        self._ticker.start()

    def phase(self, name: str) -> None:
        """The exporter starts phase ``name`` (one of :data:`PHASES`; others count as no time)."""
        with self._lock:
            shares = dict(PHASES)
            if self._name in shares:
                self._done += shares[self._name]
            self._name, self._since = name, time.monotonic()
        if not self.tty:
            log.warning("qtts: building %s: %d %% (%s), %s elapsed", self.what, self.percent, name,
                        _duration(time.monotonic() - self.t0))

    @property
    def percent(self) -> int:
        with self._lock:
            share = dict(PHASES).get(self._name, 0)
            inside = min((time.monotonic() - self._since) / (self.expected_s * share / 100.0), 0.95) if share else 0
            return int(min(self._done + share * inside, 99))

    def eta_s(self) -> float:
        """Seconds left: the first guess, trusted less and the measured pace more as the build goes on."""
        elapsed, pct = time.monotonic() - self.t0, max(self.percent, 1)
        guess, pace = self.expected_s - elapsed, elapsed * (100 - pct) / pct
        return max((1 - pct / 100) * guess + pct / 100 * pace, 0.0)

    def finish(self, ok: bool = True) -> None:
        self._stop.set()
        self._ticker.join(timeout=2)
        took = _duration(time.monotonic() - self.t0)
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        for listener in self.listeners:
            listener(100 if ok else self.percent, "done" if ok else "failed")
        if ok:
            log.warning("qtts: built %s in %s", self.what, took)

    def _tick(self) -> None:
        while not self._stop.wait(_TICK_S):
            pct = self.percent
            for listener in self.listeners:
                listener(pct, self._name)
            if self.tty:  # a progress bar is terminal output, like tqdm's, not a log record
                bar = "#" * (pct // 4) + "." * (25 - pct // 4)
                sys.stderr.write(f"\rqtts: building {self.what} [{bar}] {pct:3d} % {self._name}, "
                                 f"about {_duration(self.eta_s())} left\033[K")
                sys.stderr.flush()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
