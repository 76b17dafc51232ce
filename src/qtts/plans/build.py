"""Building a missing plan in a child process, and showing its progress.

:mod:`qtts.plans.cache` owns a build's key lock, its staging folder and the final rename;
:func:`run_child` runs the export step itself in a child process (``python -m
qtts.export.cache_build``, :data:`CHILD`), so the loading process (a server, ``qtts say``, an API
user) never imports ``qtts.export`` or torch for it, and the child's memory (a full-size 0.6B build
peaks near 11 GB) goes back to the system when the child ends.

The child's stdout carries a line protocol, one JSON object per line with an ``event``:

* ``start`` (``pid``): the export began;
* ``phase`` (``name``): the exporter started phase ``name`` (one of :data:`PHASES`);
* ``log`` (``logger``, ``level``, ``message``): a log record of the child, logged again here under
  that logger's name, so this process's logging settings decide what is shown;
* ``done`` (``build_s``): the bundle and its cache info are complete;
* ``error`` (``kind``: ``input`` | ``os`` | ``runtime``, ``message``; ``errno``, ``strerror``,
  ``filename`` for ``os``): why it failed, raised here as InputError / OSError / QttsError.

What else the child writes (its stderr: library warnings, a traceback) is logged here at debug level,
and its last line names the cause when the child ends without an ``error`` event (killed, crashed).
The child's stdin is a pipe this side never writes: when it closes (this process ended), the
child stops. A bundle counts only when the child exited 0 after ``done``; otherwise the caller
removes the staging folder, and a killed parent leaves only a ``.part`` folder no lookup matches.

:class:`BuildProgress` shows the progress here: a bar with an ETA on a terminal, log lines
otherwise, and listeners (the server's ``/health`` reads "building the plan, N %"). Phases have
their share of the build time measured on a full-size 0.6B export (:data:`PHASES`); inside a phase
the percentage moves with the time the phase is expected to take, never past its end, so the bar
keeps moving during the long graph exports. The whole build is expected to take
:func:`expected_seconds` (the measured full-size exports took 104-106 s on a 2-core Zen 5 machine:
a fixed part for tracing the graphs, and a part per GB of weights).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ..errors import InputError, QttsError

log = logging.getLogger(__name__)

#: the module the child runs (started by name: this process never imports it)
CHILD = "qtts.export.cache_build"
EXIT_ORPHANED = 3  # the child's exit code when its parent went away
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
        log.info("qtts: building %s (once; about %s expected)", what, _duration(self.expected_s))
        self._ticker.start()

    def phase(self, name: str) -> None:
        """The exporter starts phase ``name`` (one of :data:`PHASES`; others count as no time)."""
        with self._lock:
            shares = dict(PHASES)
            if self._name in shares:
                self._done += shares[self._name]
            self._name, self._since = name, time.monotonic()
        if not self.tty:
            log.info("qtts: building %s: %d %% (%s), %s elapsed", self.what, self.percent, name,
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
            log.info("qtts: built %s in %s", self.what, took)

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


# ----------------------------------------------------------------------------- the child process
_EMIT_LOCK = threading.Lock()
_TAIL_LINES = 20


def emit(stream, event: str, **fields) -> None:
    """Write one protocol line (the child's side; thread-safe)."""
    line = json.dumps({"event": event, **fields}, default=str)
    with _EMIT_LOCK:
        stream.write(line + "\n")
        stream.flush()


def run_child(snapshot: str, out: str, options: dict, info: dict, info_path: str, what: str,
              listeners: tuple = ()) -> str:  # fmt: skip
    """Export ``snapshot`` into ``out`` in a child process with ExportOptions ``options`` and write
    ``info`` to ``info_path`` there; progress shown as ``what``. Returns ``out``; raises InputError,
    OSError or QttsError (one line) when the child fails or is killed."""
    cmd = [sys.executable, "-m", CHILD, snapshot, out, "--options", json.dumps(options), "--info",
           json.dumps(info), "--info-path", info_path]  # fmt: skip
    # close_fds (the default): the child inherits no lock; stdin: a pipe whose end tells it we are gone
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_child_env(), text=True, encoding="utf-8", errors="replace", bufsize=1)  # fmt: skip
    tail: collections.deque = collections.deque(maxlen=_TAIL_LINES)
    reader = threading.Thread(target=_read_stderr, args=(proc.stderr, tail), name="qtts-build-stderr", daemon=True)
    reader.start()
    progress = BuildProgress(what, expected_seconds(weights_bytes(snapshot)), listeners)
    events: dict = {}
    ok = False
    try:
        events = _relay(proc.stdout, progress)
        proc.wait()
        ok = proc.returncode == 0 and "done" in events and os.path.isfile(os.path.join(out, "plan.json"))
    finally:
        if proc.poll() is None:  # interrupted here (Ctrl-C, an error): the child must not outlive the build
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        proc.stdin.close()  # only now: a closed stdin before the child's exit would read as "parent gone"
        proc.stdout.close()
        progress.finish(ok)
    if not ok:
        raise _failure(what, proc.returncode, events, tail)
    return out


def _child_env() -> dict:
    """Our environment, with this qtts first on the child's path (not only an installed one)."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.basename(src) not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _read_stderr(stream, tail: collections.deque) -> None:
    for line in stream:
        line = line.rstrip()
        if line:
            tail.append(line)
            log.debug("qtts: build process: %s", line)
    stream.close()


def _relay(stream, progress: BuildProgress) -> dict:
    """Read protocol lines until the child closes its stdout; the last event of each kind."""
    events = {}
    for line in stream:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            log.debug("qtts: build process (not protocol): %s", line.rstrip())
            continue
        event = msg.get("event")
        if event == "phase":
            progress.phase(str(msg.get("name", "")))
        elif event == "log":
            logging.getLogger(str(msg.get("logger") or __name__)).log(int(msg.get("level", logging.INFO)), "%s",
                                                                      msg.get("message", ""))  # fmt: skip
        elif event in ("start", "done", "error"):
            events[event] = msg
    return events


def _failure(what: str, rc: int, events: dict, tail) -> Exception:
    """One clear error for a build that did not complete."""
    err = events.get("error")
    if err:
        message = str(err.get("message") or "no message")
        if err.get("kind") == "input":
            return InputError(message)
        if err.get("kind") == "os" and err.get("errno"):
            return OSError(int(err["errno"]), err.get("strerror") or message, err.get("filename"))
        return QttsError(f"building {what} failed: {message}")
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        hint = " (out of memory? a full-size build needs about 11 GB)" if name == "SIGKILL" else ""
        return QttsError(f"building {what} failed: the build process was stopped by {name}{hint}; nothing of it "
                         "was kept: start again to rebuild, or pass --plan torch")  # fmt: skip
    last = tail[-1] if tail else "no output"
    if rc == 0:
        return QttsError(f"building {what} failed: the build process ended without completing the bundle ({last})")
    return QttsError(f"building {what} failed: the build process exited with code {rc}: {last}")


def weights_bytes(snapshot: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(snapshot) for f in fs
               if f.endswith(".safetensors"))  # fmt: skip
