"""Ray Serve scale-out (extra ``ray``): the OpenAI-compatible app on every replica, one batched engine each.

Each replica loads ``qtts.load(model, plan, max_batch=N)`` once and serves the same FastAPI app as
``qtts serve`` (:func:`qtts.server.create_app`) as its ingress, so routes, validation, formats,
streaming and errors are identical; Ray's HTTP proxy routes requests to replicas and passes the
chunked audio through. Every response names its replica in ``X-Qtts-Replica`` (the replica's
actor name in the ``serve`` namespace).

Admission: a replica accepts ``max_batch + max_queue`` requests (Ray's ``max_ongoing_requests``):
``max_batch`` run in its batch, ``max_queue`` wait in its own queue; Ray's router holds at most
``max_queue`` more per deployment (``max_queued_requests``) and answers 503 past that.

* :func:`build_app` -> a ``serve.Application`` from a :class:`RayConfig`;
* :func:`app_builder` -> the same from ``serve run qtts.server.ray_serve:app_builder model=...``
  arguments (strings), for a Serve config file;
* :func:`run` starts or joins a cluster, starts Serve's proxy on ``host:port`` and deploys.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field

from ..errors import InputError, require

log = logging.getLogger(__name__)

APP_NAME = "qtts"
REPLICA_HEADER = b"x-qtts-replica"
#: Ray Serve's proxy deadlines (its defaults: 5 s to come up, 10 s per health check) are too short
#: on a small busy machine: the proxy process (Ray, Starlette, uvicorn imports) can take longer to
#: start, and Serve then kills it and ``serve.start`` fails. A cluster this process starts gets
#: these unless the environment already sets them.
PROXY_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


def patient_proxy_env() -> None:
    """Set :data:`PROXY_ENV` (where unset) for the Ray processes this process is about to start."""
    for name, value in PROXY_ENV.items():
        os.environ.setdefault(name, value)


@dataclass(frozen=True)
class RayConfig:
    #: snapshot dir or hub id; the same path must exist on every node that runs a replica
    model: str
    #: execution plan JSON (same path on every node), a preset name or "torch"; None = the default
    #: preset (each node builds or finds it in its cache; `qtts serve --ray` resolves it first)
    plan: str | None = None
    dtype: str = "float32"
    #: intra-op threads per replica (None: qtts's default for the model size)
    threads: int | None = None
    #: streams one replica steps together (its batch); also its concurrent requests
    max_batch: int = 8
    #: fixed replica count (ignored when autoscale is set)
    replicas: int = 1
    #: (min, max) replicas: Ray adds replicas while each has more than max_batch requests ongoing
    autoscale: tuple[int, int] | None = None
    #: CPUs Ray reserves per replica (its engine thread plus the callers' vocoders use them)
    num_cpus: float = 1.0
    #: ServerSettings fields of every replica's app (max_queue, max_frames, voices_dir, ...)
    settings: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.max_batch < 1 or self.replicas < 1 or self.num_cpus <= 0:
            raise InputError("max_batch and replicas must be >= 1 and num_cpus > 0")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 0 <= low <= high or high < 1:
                raise InputError(f"autoscale={self.autoscale}: need 0 <= min <= max and max >= 1")

    def server_settings(self):
        from .settings import ServerSettings

        return ServerSettings(**{**self.settings, "max_batch": self.max_batch, "max_concurrency": 1})


class ReplicaHeader:
    """ASGI wrapper: adds ``X-Qtts-Replica`` to every HTTP response of the wrapped app."""

    def __init__(self, app, replica: str):
        self.app, self.replica = app, replica.encode("ascii", "replace")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), (REPLICA_HEADER, self.replica)])
            await send(message)

        return await self.app(scope, receive, send_named)


class QttsReplica:
    """One replica: a batched engine and the qtts app over it (decorated by :func:`build_app`)."""

    def __init__(self, config: dict):
        import qtts

        self.config = RayConfig(**config)
        c = self.config
        self.engine = qtts.load(c.model, plan=c.plan, dtype=c.dtype, threads=c.threads, max_batch=c.max_batch)
        self.engine.warm()  # the replica's first request as fast as the next

    def __serve_build_asgi_app__(self):
        from ray import serve

        from . import create_app

        replica = serve.get_replica_context().replica_id.to_full_id_str()
        log.info("qtts replica %s ready (max_batch %d)", replica, self.config.max_batch)
        return ReplicaHeader(create_app(self.engine, self.config.server_settings()), replica)

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


def build_app(config: RayConfig):
    """The Serve application: deployment ``qtts`` with the replica count or autoscaling of ``config``."""
    serve = require("ray.serve", "ray", "Ray Serve scale-out")
    settings = config.server_settings()  # checked here, before any replica starts
    options = {
        "name": APP_NAME,
        "max_ongoing_requests": config.max_batch + settings.max_queue,
        "max_queued_requests": max(1, settings.max_queue),
        "ray_actor_options": {"num_cpus": config.num_cpus},
        "health_check_period_s": 2.0,
    }
    if config.autoscale is not None:
        low, high = config.autoscale
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                                         "target_ongoing_requests": config.max_batch}  # fmt: skip
    else:
        options["num_replicas"] = config.replicas
    deployment = serve.deployment(serve.ingress()(QttsReplica), **options)
    return deployment.bind(dataclasses.asdict(config))


def app_builder(args: dict):
    """``serve run qtts.server.ray_serve:app_builder model=/path max_batch=8 replicas=2`` (strings):
    model, plan, dtype, threads, max_batch, replicas, autoscale ("1:4"), num_cpus, and any
    ServerSettings field (max_queue=8, max_frames=2048, ...)."""
    from .settings import ServerSettings

    args = dict(args)
    if "model" not in args:
        raise InputError("app_builder needs model=<snapshot dir or hub id>")
    casts = {"threads": int, "max_batch": int, "replicas": int, "num_cpus": float}
    kw = {k: casts[k](args.pop(k)) for k in list(args) if k in casts}
    if "autoscale" in args:
        low, _, high = str(args.pop("autoscale")).partition(":")
        kw["autoscale"] = (int(low), int(high or low))
    for k in ("model", "plan", "dtype"):
        if k in args:
            kw[k] = args.pop(k)
    fields = {f.name: f.type for f in dataclasses.fields(ServerSettings)}
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise InputError(f"unknown app_builder argument(s): {', '.join(unknown)}")
    kw["settings"] = {k: _settings_value(v, fields[k]) for k, v in args.items()}
    return build_app(RayConfig(**kw))


def _settings_value(value, annotation: str):
    if not isinstance(value, str):
        return value
    if "int" in annotation:
        return int(value)
    if "float" in annotation:
        return float(value)
    if "bool" in annotation:
        return value.lower() in ("1", "true", "yes")
    return value


def run(config: RayConfig, address: str | None = None, host: str = "127.0.0.1", port: int = 8000,
        blocking: bool = True):
    """Join the cluster at ``address`` ("auto" = the one ``ray start --head`` made here; None = start
    a local one for this process), start Serve's HTTP proxy on ``host:port`` and deploy."""
    ray = require("ray", "ray", "Ray Serve scale-out")
    serve = require("ray.serve", "ray", "Ray Serve scale-out")
    app = build_app(config)
    if not ray.is_initialized():
        if address is None:
            patient_proxy_env()
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": int(port)})
    return serve.run(app, name=APP_NAME, route_prefix="/", blocking=blocking)
