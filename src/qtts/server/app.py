"""The FastAPI app factory: ``create_app(engine, settings) -> FastAPI``.

``engine`` is a loaded :class:`qtts.TTS`, a list of them (one per worker slot), or ``None``
while the model is still loading (``/health`` answers 503 until :meth:`ServerState.set_engine`).

Concurrency model (see docs/operations.md): ``max_concurrency`` (or ``max_batch``) worker threads, each
holding one engine *slot* (a batched engine fills every slot itself); requests beyond that wait in a FIFO of ``max_queue`` places, then get 429. One
:class:`qtts.TTS` keeps per-call state inside ``stream()`` only if it says so with
``thread_safe = True``; otherwise one engine serves one generation at a time, and several
slots need several engines (``create_app([tts1, tts2], ...)``), or ``max_concurrency=1``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from ..version import __version__
from .errors import ERROR_RESPONSES, ApiError, install_error_handlers
from .metrics import CONTENT_TYPE, ServerMetrics, batch_observer, capacity_gauges
from .middleware import AccessMiddleware
from .settings import ServerSettings
from .voices import VoiceStore, engine_languages, engine_speakers
from .worker import Scheduler

log = logging.getLogger(__name__)


def make_slots(engine, max_concurrency: int) -> list:
    """One engine handle per worker slot (see the module docstring). A batched engine
    (``qtts.load(..., max_batch=N)``) is thread-safe: all slots share it and its one batch."""
    if isinstance(engine, (list, tuple)):
        if not engine:
            raise ValueError("an empty engine list")
        return list(engine)
    batch = getattr(engine, "max_batch", 1)
    if batch > 1 and max_concurrency > batch:
        log.warning("%d slots on an engine that batches %d streams: the others wait inside the engine",
                    max_concurrency, batch)
    if engine.thread_safe:
        return [engine] * max_concurrency
    if max_concurrency > 1:
        log.warning("the engine is not thread-safe: serving one generation at a time (pass one engine per "
                    "slot to create_app for max_concurrency=%d)", max_concurrency)
    return [engine]


class ServerState:
    """What the routes share: settings, metrics, voice store, engine slots and scheduler."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.metrics = ServerMetrics()
        self.store = VoiceStore(settings.voices_dir)
        self.engine = None
        self.scheduler: Scheduler | None = None
        self.load_error: str | None = None
        self.building: str | None = None  # "building plan 'fast', 42 % (talker)" while a bundle is built
        self.timestamps = "piece"  # what word timestamps time: "word" (a forced aligner) or "piece"
        self.timestamps_error: str | None = None  # why a found aligner cannot be loaded (speech_words)
        self._observer = None
        self.live_clients: dict[str, int] = {}  # open live sessions per client address (event loop only)
        self.started = time.time()
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    def set_engine(self, engine, capacity: int | None = None) -> None:
        """Install the loaded engine(s); the server is ready afterwards. Callable from any thread.
        ``capacity``: streams held in real time, as measured at start-up (else the settings')."""
        slots = self.settings.slots if capacity is None else min(capacity, max(self.settings.max_concurrency,
                                                                               self.settings.max_batch))
        slots = make_slots(engine, slots)[:slots]
        from .routes.speech_words import timestamp_level

        timestamps = timestamp_level(slots[0])  # loads the aligner now, not on the first request
        with self._lock:
            self.timestamps, self.timestamps_error = timestamps
            self.scheduler = Scheduler(slots, self.settings.max_queue, self.settings.queue_timeout_s,
                                       self.metrics)
            self.engine = slots[0]
        batch = getattr(self.engine, "batch", None)  # a batched TTS: record its steps
        if batch is not None:
            self._observer = batch_observer(self.metrics)
            batch.add_observer(self._observer)
        self.metrics.ready.set(1)

    def shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown()
        batch = getattr(self.engine, "batch", None) if self._observer is not None else None
        if batch is not None:
            batch.remove_observer(self._observer)

    def set_load_error(self, message: str) -> None:
        self.load_error = message

    def build_listener(self, what: str):
        """A :mod:`qtts.plans.build` progress listener: /health says how far the plan build is."""

        def listen(percent: int, phase: str) -> None:
            self.building = None if phase == "done" else f"building {what}, {percent} % ({phase})"

        return listen

    def require_ready(self) -> None:
        if not self.ready:
            why = f"model failed to load: {self.load_error}" if self.load_error else (
                self.building or "model is still loading")
            raise ApiError(503, f"not ready: {why}; poll GET /health", "not_ready",
                           headers={"Retry-After": "5"})

    def model_info(self) -> dict:
        e = self.engine
        info = {"id": self.settings.model_id, "object": "model", "owned_by": "qtts", "qtts_version": __version__}
        for attr in ("model_type", "tts_model_type", "model_size", "path"):
            value = getattr(e, attr, None)
            if isinstance(value, (str, int, float)):
                info[attr] = value
        plan = getattr(getattr(e, "components", None), "plan", None)
        if plan is not None:
            from ..plans.cache import plan_label

            info["plan"] = plan_label(plan)
        info["speakers"] = engine_speakers(e)
        info["languages"] = engine_languages(e)
        info["timestamps"] = self.timestamps
        return info


def _batch_health(engine) -> dict:
    """max_batch, and for a batched engine the streams it holds (active) and queues (waiting)."""
    batch = getattr(engine, "batch", None)
    info = {"max_batch": getattr(engine, "max_batch", 1)}
    if batch is not None:
        info.update(batch_active=batch.active, batch_waiting=batch.waiting)
    return info


def _ops_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health", responses={503: ERROR_RESPONSES[503]})
    async def health() -> dict:
        """200 with model info once the model is loaded; 503 before (or if loading failed)."""
        state.require_ready()
        sched = state.scheduler
        return {"status": "ok", "model": state.model_info(), "uptime_s": round(time.time() - state.started, 1),
                "max_concurrency": sched.capacity, "in_flight": sched.in_flight, "queue_depth": sched.queue_depth,
                "max_queue": sched.max_queue, "live_sessions": sum(state.live_clients.values()),
                **_batch_health(state.engine),
                **capacity_gauges(state.metrics, sched, state.engine)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text format."""
        if state.scheduler is not None:
            state.metrics.queue_depth.set(state.scheduler.queue_depth)
            state.metrics.in_flight.set(state.scheduler.in_flight)
            capacity_gauges(state.metrics, state.scheduler, state.engine)
        return PlainTextResponse(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", responses=ERROR_RESPONSES)
    async def models() -> dict:
        """The one served model (OpenAI's list shape)."""
        state.require_ready()
        return {"object": "list", "data": [state.model_info()]}


def create_app(engine=None, settings: ServerSettings | None = None) -> FastAPI:
    """The ASGI app. ``engine=None``: not ready until ``app.state.qtts.set_engine(tts)``."""
    from .page import router as page_router
    from .routes.speech import router as speech_router
    from .routes.speech_stream import router as stream_router
    from .routes.voices import router as voice_router

    settings = settings or ServerSettings()
    state = ServerState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        state.shutdown()

    # redirect_slashes=False: Starlette builds the redirect from the client's Host header.
    # docs_url/redoc_url=None: FastAPI's pages load Swagger UI/ReDoc from a CDN; /docs is ours (page.py)
    app = FastAPI(title="qtts", version=__version__, lifespan=lifespan, redirect_slashes=False,
                  docs_url=None, redoc_url=None,
                  description="Streaming Qwen3-TTS speech synthesis with an OpenAI-compatible API.")
    app.state.qtts = state
    install_error_handlers(app)
    _ops_routes(app, state)
    app.include_router(speech_router)
    app.include_router(stream_router)
    app.include_router(voice_router)
    app.include_router(page_router)
    app.add_middleware(AccessMiddleware, state=state)

    if engine is not None:
        state.set_engine(engine)
    return app
