"""Prometheus metrics in the text exposition format (version 0.0.4), written by hand.

A few counters, gauges and histograms with labels; thread-safe (workers update them). No
dependency on prometheus_client.
"""

from __future__ import annotations

import bisect
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(names: tuple[str, ...], values: tuple) -> str:
    if not names:
        return ""
    parts = []
    for n, v in zip(names, values):
        s = str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        parts.append(f'{n}="{s}"')
    return "{" + ",".join(parts) + "}"


def _num(x: float) -> str:
    x = float(x)
    if x == float("inf"):
        return "+Inf"
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help_, labels
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help_, labels=()):
        super().__init__(name, help_, labels)
        self._values: dict[tuple, float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels) -> None:
        key = tuple(labels[n] for n in self.label_names)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels) -> float:
        return self._values.get(tuple(labels[n] for n in self.label_names), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.label_names, k)} {_num(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels) -> None:
        key = tuple(labels[n] for n in self.label_names)
        with self._lock:
            self._values[key] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help_, buckets: tuple[float, ...]):
        super().__init__(name, help_)
        self.buckets = tuple(sorted(buckets))
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0
        self._n = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value
            self._n += 1

    @property
    def count(self) -> int:
        return self._n

    def render(self) -> list[str]:
        with self._lock:
            counts, total, n = list(self._counts), self._sum, self._n
        lines, cum = self.header(), 0
        for le, c in zip(self.buckets + (float("inf"),), counts):
            cum += c
            lines.append(f'{self.name}_bucket{{le="{_num(le)}"}} {cum}')
        lines += [f"{self.name}_sum {_num(total)}", f"{self.name}_count {n}"]
        return lines


class ServerMetrics:
    """Everything /metrics reports."""

    def __init__(self):
        p = "qtts_"
        self.requests = Counter(p + "requests_total", "HTTP requests by route, method and status.",
                                ("route", "method", "status"))
        self.errors = Counter(p + "errors_total", "Failed requests (5xx, or generation errors after "
                              "streaming started) by route and kind.", ("route", "kind"))
        self.audio_seconds = Counter(p + "audio_seconds_total", "Seconds of audio generated.")
        self.frames = Counter(p + "frames_generated_total", "Codec frames generated (12.5 per second).")
        self.cancelled = Counter(p + "requests_cancelled_total",
                                 "Generations stopped early because the client went away.")
        self.rtf = Histogram(p + "rtf", "Real-time factor per request: generation wall time / audio "
                             "duration (lower is faster).", (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10, 20))
        self.ttfa = Histogram(p + "ttfa_seconds", "Time to first audio: request admitted to first "
                              "response bytes ready (includes the queue wait).",
                              (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300))
        self.queue_wait = Histogram(p + "queue_wait_seconds", "Time a request waited for a worker.",
                                    (0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300))
        self.connections_closed = Counter(p + "connections_closed_total", "Connections the server closed "
                                          "for a client: header_timeout, body_timeout, write_timeout, "
                                          "over_limit.", ("reason",))
        self.batch_size = Histogram(p + "batch_size", "Streams in each batched talker step of the engine.",
                                    (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64))
        self.frame_seconds = Histogram(p + "frame_seconds", "Per-stream frame latency: seconds between a "
                                       "stream's consecutive frames (80 ms of audio each) in the batched engine.",
                                       (0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5))
        self.batch_streams = Gauge(p + "batch_streams", "Streams in the batched engine now (state 'active' or "
                                   "'waiting' for a row).", ("state",))
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for a worker.")
        self.in_flight = Gauge(p + "in_flight", "Generations running now.")
        self.live_sessions = Gauge(p + "live_sessions", "WebSocket live speech sessions open now (a session "
                                   "holds a worker only while an utterance speaks).")
        self.ready = Gauge(p + "ready", "1 when the model is loaded and the server accepts work.")
        self.capacity = Gauge(p + "capacity", "Streams the server holds in real time at once (configured "
                              "or measured at start-up); more wait in the queue.")
        self.active_streams = Gauge(p + "active_streams", "Streams being generated now (at most the capacity).")
        self.margin = Gauge(p + "stream_margin_seconds", "Real-time margin of the active streams: audio "
                            "delivered minus wall time since each stream's first audio ('min' over the "
                            "streams, and 'mean'); below 0 a listener stalls.", ("stat",))

    def render(self) -> str:
        lines: list[str] = []
        for m in (self.requests, self.errors, self.audio_seconds, self.frames, self.cancelled, self.rtf,
                  self.ttfa, self.queue_wait, self.connections_closed, self.batch_size, self.frame_seconds,
                  self.batch_streams, self.queue_depth, self.in_flight, self.live_sessions, self.ready, self.capacity,
                  self.active_streams, self.margin):
            lines += m.render()
        return "\n".join(lines) + "\n"


def batch_observer(metrics: ServerMetrics):
    """A :class:`qtts.engine.batching.BatchEngine` observer that records its steps in ``metrics``."""

    def observe(stats) -> None:
        if stats.rows:
            metrics.batch_size.observe(stats.rows)
        for seconds in stats.intervals:
            metrics.frame_seconds.observe(seconds)
        metrics.batch_streams.set(stats.active, state="active")
        metrics.batch_streams.set(stats.waiting, state="waiting")

    return observe


def capacity_gauges(metrics: ServerMetrics, scheduler, engine) -> dict:
    """Set the capacity gauges from the scheduler and the engine's vocoder batcher (if any); the
    same facts for /health: capacity, active streams and their real-time margins."""
    batcher = getattr(engine, "vocoder_batch", None)
    margins = sorted(batcher.margins()) if callable(getattr(batcher, "margins", None)) else []
    metrics.capacity.set(scheduler.capacity)
    metrics.active_streams.set(scheduler.in_flight)
    low = margins[0] if margins else 0.0
    mean = sum(margins) / len(margins) if margins else 0.0
    metrics.margin.set(low, stat="min")
    metrics.margin.set(mean, stat="mean")
    return {"capacity": scheduler.capacity, "active_streams": scheduler.in_flight,
            "margin_s": [round(m, 3) for m in margins]}
