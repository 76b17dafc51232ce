"""``qtts serve``: the OpenAI-compatible HTTP server (extra ``serve``)."""

from __future__ import annotations

import ipaddress
import logging

from ..errors import InputError
from ..server.settings import SUPPORTED_FORMATS
from .common import add_model, add_stderr_handler, cli_plan, command, number

log = logging.getLogger(__name__)


def register(sub) -> None:
    p = command(sub, "serve", run, "serve an OpenAI-compatible streaming speech API over HTTP "
                "(POST /v1/audio/speech; live text in, speech out: WebSocket /v1/audio/speech/stream)")
    add_model(p, threads="CPU threads for each engine's math (intra-op; default: cores / K)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=number(lo=0, hi=65535), default=8000, help="TCP port (default 8000)")
    p.add_argument("--voices", metavar="DIR", help="folder for uploaded voices (POST /v1/voices); "
                   "without it uploads are disabled")
    p.add_argument("--max-concurrency", type=number(lo=1), default=1, metavar="K",
                   help="generations at once; loads K engine copies (K x model memory), default 1")
    p.add_argument("--max-batch", type=number(lo=1), metavar="N",
                   help="one engine steps up to N generations together (one copy of the weights); "
                   "instead of --max-concurrency (default 1; 8 per replica with --ray)")
    p.add_argument("--capacity", type=_capacity, metavar="N|auto",
                   help="streams served at once so that each stays real-time; more wait in the queue "
                   "(429 past --max-queue). 'auto': measured at start-up in a few seconds (default: every slot)")
    _ray_arguments(p)
    p.add_argument("--max-queue", type=number(lo=0), default=8, metavar="Q",
                   help="requests waiting for a worker before 429 (default 8)")
    p.add_argument("--max-input-chars", type=number(lo=1), default=4096, help="longest 'input' text (default 4096)")
    p.add_argument("--max-frames", type=number(lo=1), default=2048,
                   help="frame cap per request, 12.5 frames/s (default 2048 = 164 s)")
    p.add_argument("--max-upload-mb", type=number(float, above=0), default=10.0,
                   help="largest voice upload (default 10 MB)")
    p.add_argument("--chunk-frames", type=number(lo=1), help="frames per streamed chunk after the first (default 8)")
    p.add_argument("--aligner", metavar="DIR|HUB_ID", help="the Qwen3-ForcedAligner-0.6B snapshot that times words "
                   "for requests with timestamps: true, loaded at start-up (default: $QTTS_ALIGNER, else the official "
                   "one if it is in the Hugging Face cache, else none: times per text piece; docs/timestamps.md)")
    _openai_arguments(p)
    p.add_argument("--model-id", help="model name reported by /health and /v1/models (default: --model)")
    p.add_argument("--no-access-log", action="store_true", help="no JSON access-log lines on stderr")
    _add_limits(p)


def _add_limits(p) -> None:
    """Timeouts, connection caps, the origin policy and the WebSocket's limits."""
    p.add_argument("--header-timeout", type=number(float, above=0), default=10.0, metavar="S",
                   help="seconds a connection has to send its request headers (default 10)")
    p.add_argument("--body-timeout", type=number(float, above=0), default=60.0, metavar="S",
                   help="seconds a request has to send its whole body (default 60)")
    p.add_argument("--write-timeout", type=number(float, above=0), default=60.0, metavar="S",
                   help="seconds a client may read nothing of a response before it is aborted (default 60)")
    p.add_argument("--max-connections", type=number(lo=1), default=256, metavar="N",
                   help="open connections at most; more get 503 (default 256)")
    p.add_argument("--max-connections-per-client", type=number(lo=1), default=64, metavar="N",
                   help="open connections from one client address; more get 503 (default 64; a proxy named "
                   "in --forwarded-allow-ips counts against --max-connections only)")
    p.add_argument("--forwarded-allow-ips", action="append", default=[], metavar="IP",
                   help="a reverse proxy (IP address or network, e.g. 127.0.0.1 or 10.0.0.0/8; * any) whose "
                   "X-Forwarded-For names the client; repeatable or comma-separated. Default: none, the client "
                   "is the TCP peer (docs/operations.md, who is a client)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (scheme://host[:port]) whose pages may use the API besides the server's "
                   "own page; repeatable; * allows any (docs/operations.md, origin policy)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name to accept besides localhost and the bound address (a reverse proxy's "
                   "or the LAN name); repeatable; * allows any")
    w = p.add_argument_group("live speech (WebSocket /v1/audio/speech/stream)")
    w.add_argument("--ws-max-message-chars", type=number(lo=1), default=4096, metavar="N",
                   help="longest text.delta (default 4096 characters)")
    w.add_argument("--ws-max-session-chars", type=number(lo=1), default=20000, metavar="N",
                   help="all text of one session (default 20000 characters)")
    w.add_argument("--ws-idle-timeout", type=number(float, above=0), default=30.0, metavar="S",
                   help="close a session with no new text and no audio for S seconds before text.done (default 30)")
    w.add_argument("--ws-max-session", type=number(float, above=0), default=1800.0, metavar="S",
                   help="longest session in seconds (default 1800)")
    w.add_argument("--ws-max-messages-per-s", type=number(float, above=0), default=200.0, metavar="R",
                   help="messages per second one socket may send, bursts of 2R (default 200)")
    w.add_argument("--ws-max-pings-per-s", type=number(float, above=0), default=5.0, metavar="R",
                   help="pings per second one socket may send, bursts of 2R (default 5)")
    w.add_argument("--ws-max-sessions-per-client", type=number(lo=1), default=2, metavar="N",
                   help="live sessions open at once from one client address; more are closed with 1013 "
                   "(default 2; behind a reverse proxy name it with --forwarded-allow-ips)")
    w.add_argument("--ws-utterance-gap", type=number(float, above=0), default=1.0, metavar="S",
                   help="an utterance ends (its worker slot goes back) after S seconds without new text, or, "
                   "while others wait, when it waits for text S seconds beyond its audio (default 1)")



def _openai_arguments(p) -> None:
    o = p.add_argument_group("OpenAI drop-in")
    o.add_argument("--default-format", default="mp3", choices=SUPPORTED_FORMATS,
                   help="response_format when a request names none (default mp3, as OpenAI; wav: the old default)")
    o.add_argument("--voice-alias", action="append", default=[], metavar="NAME=VOICE", type=_alias,
                   help="answer voice NAME with VOICE (a speaker or an uploaded voice id), e.g. alloy=vivian; "
                   "repeatable; overrides the default table of OpenAI voice names (docs/server.md)")


def _alias(text: str) -> tuple[str, str]:
    import argparse

    from ..server.aliases import parse_alias

    try:
        return parse_alias(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None



def _ray_arguments(p) -> None:
    ray = p.add_argument_group("Ray Serve scale-out (extra 'ray')")
    ray.add_argument("--ray", action="store_true", help="serve through Ray Serve: replicas of one batched "
                     "engine each behind Ray's HTTP proxy on --host/--port")
    ray.add_argument("--address", help="Ray cluster to join ('auto': the one `ray start --head` started here; "
                     "default: start a local one for this command)")
    ray.add_argument("--replicas", type=number(lo=1), default=1, help="replicas (default 1)")
    ray.add_argument("--autoscale", metavar="MIN:MAX", help="autoscale between MIN and MAX replicas instead")
    ray.add_argument("--replica-cpus", type=number(float, above=0), default=1.0,
                     help="CPUs Ray reserves per replica (default 1)")


def _capacity(text: str):
    if text == "auto":
        return text
    return number(lo=1)(text)


def _settings(args):
    from ..server.settings import ServerSettings

    return ServerSettings(
        host=args.host, port=args.port, voices_dir=args.voices, max_concurrency=args.max_concurrency,
        max_batch=args.max_batch or 1, capacity=args.capacity if isinstance(args.capacity, int) else None,
        max_queue=args.max_queue, max_input_chars=args.max_input_chars, max_frames=args.max_frames,
        max_upload_bytes=int(args.max_upload_mb * 1024 * 1024), chunk_frames=args.chunk_frames,
        default_response_format=args.default_format, voice_aliases=tuple(args.voice_alias),
        model_id=args.model_id or args.model,
        access_log=not args.no_access_log, header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
        write_timeout_s=args.write_timeout, max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        forwarded_allow_ips=tuple(ip.strip() for v in args.forwarded_allow_ips for ip in v.split(",") if ip.strip()),
        allow_origins=tuple(args.allow_origin),
        allow_hosts=tuple(args.allow_host), ws_max_messages_per_s=args.ws_max_messages_per_s,
        ws_max_pings_per_s=args.ws_max_pings_per_s, ws_max_message_chars=args.ws_max_message_chars,
        ws_max_session_chars=args.ws_max_session_chars,
        ws_idle_timeout_s=args.ws_idle_timeout, ws_max_session_s=args.ws_max_session,
        ws_max_sessions_per_client=args.ws_max_sessions_per_client, ws_utterance_gap_s=args.ws_utterance_gap,
    )


def _load_engines(args, state) -> None:
    """Background: load K engines, then mark the server ready (or record the failure)."""
    import os

    import qtts

    from ..errors import InputError
    from ..plans.cache import plan_label

    k, batch = args.max_concurrency, args.max_batch or 1
    threads = args.threads or (None if batch > 1 else max(1, (os.cpu_count() or 1) // k))
    try:
        plan = cli_plan(args, (state.build_listener("the plan"),))  # a missing bundle is built first
        if batch > 1:  # one engine, one copy of the weights, every slot shares its batch
            engines = qtts.load(args.model, plan=plan, dtype=args.dtype, threads=threads, max_batch=batch,
                                aligner=args.aligner)  # fmt: skip
        else:
            engines = [qtts.load(args.model, plan=plan, dtype=args.dtype, threads=threads, aligner=args.aligner)
                       for _ in range(k)]  # fmt: skip
        if args.aligner:  # named: loaded before "ready", a failure is the load error (else: qtts.server.routes.speech_words)
            (engines if batch > 1 else engines[0]).aligner  # noqa: B018
        for engine in [engines] if batch > 1 else engines:
            engine.warm()  # the first listener's audio as soon as the next one's
    except InputError as exc:  # one line, no traceback: --no-build with nothing cached, a bad --plan
        log.error("qtts: cannot load %s: %s", args.model, exc)
        state.set_load_error(str(exc))
        return
    except Exception as exc:  # reported by /health; the process keeps serving 503s
        log.exception("loading %s failed", args.model)
        state.set_load_error(f"{type(exc).__name__}: {exc}")
        return
    capacity = _measured_capacity(engines) if args.capacity == "auto" else None
    state.set_engine(engines, capacity=capacity)
    what = f"1 engine batching {batch} streams" if batch > 1 else f"{k} engine(s)"
    first = engines if batch > 1 else engines[0]
    label = plan_label(first.components.plan)
    log.info("model %s loaded (%s); ready (plan %s); capacity %d streams", args.model, what, label,
             state.scheduler.capacity)
    print(f"qtts: model {args.model} loaded ({what}); ready (plan {label})", flush=True)  # stdout, beside "serving on"


def check_model(model: str) -> None:
    """Refuse (exit 2) before serving a model that cannot load: a missing folder, or a folder that is
    not a Qwen3-TTS snapshot. A hub id is resolved (cache or download) by the loader; if that fails
    the server stays up and /health answers 503 with the reason."""
    import os
    import re

    from ..config import ModelConfig

    path = os.path.expanduser(model)
    if os.path.isdir(path):
        ModelConfig.from_dir(path)  # InputError naming the missing or malformed file
    elif not re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", path):
        raise InputError(f"--model {model}: no such snapshot directory; pass a local Qwen3-TTS snapshot directory "
                         "or a hub id like Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")


def check_aligner(spec: str | None) -> None:
    """Refuse (exit 2) an ``--aligner`` folder that does not exist or has no config.json (a hub id is
    resolved by the loader; a failure there makes /health answer 503 with the reason)."""
    import os
    import re

    path = os.path.expanduser(spec or "")
    if not spec or (re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", spec) and not os.path.exists(path)):
        return
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError(f"--aligner {spec}: no Qwen3-ForcedAligner snapshot there (no config.json); download one "
                         "with: hf download Qwen/Qwen3-ForcedAligner-0.6B --local-dir DIR")


def _measured_capacity(engines) -> int | None:
    """--capacity auto: the streams a batched engine holds in real time here (one engine per slot
    otherwise: every slot)."""
    if isinstance(engines, list):
        log.warning("qtts: --capacity auto measures a batched engine (--max-batch); serving every slot")
        return None
    from ..server.capacity import measure_capacity

    try:
        return measure_capacity(engines)
    except Exception:  # the probe is an estimate: serve every slot rather than not at all
        log.exception("qtts: the capacity probe failed; serving every slot")
        return None


def _check_host(host: str) -> None:
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise InputError(f"--host {host!r}: give an IP address (127.0.0.1, 0.0.0.0, ::1)") from None
        return
    if not addr.is_loopback:
        log.warning("qtts: listening on %s: the API has no authentication; put it behind a proxy", host)


def _access_log() -> None:
    access = logging.getLogger("qtts.server.access")
    add_stderr_handler(access, "%(message)s")  # stderr, one JSON object per line
    access.setLevel(logging.INFO)
    access.propagate = False


def run(args) -> int:
    import importlib.util
    import threading

    from ..errors import require
    from ..plans.cache import TORCH, check_plan_name, env_no_build, preset_name

    require("fastapi", "serve", "qtts serve")
    require("uvicorn", "serve", "qtts serve")
    require("websockets", "serve", "qtts serve (the live speech WebSocket)")
    if importlib.util.find_spec("python_multipart") is None and importlib.util.find_spec("multipart") is None:
        require("python_multipart", "serve", "voice uploads (python-multipart)")
    from ..server import create_app
    from ..server.malloc import limit_arenas
    from ..server.runner import serve_forever

    limit_arenas()  # before any thread starts: RSS stays flat under churn (qtts.server.malloc)
    _check_host(args.host)
    settings = _settings(args)
    check_model(args.model)
    check_aligner(args.aligner)
    check_plan_name(args.plan)
    if args.plan and args.plan != TORCH and preset_name(args.plan) is None:
        from ..plans.plan import load_plan

        load_plan(args.plan)  # a missing or unreadable plan file: exit 2 before serving
    _access_log()
    if args.no_build or env_no_build():  # nothing is built: a missing bundle fails now, exit 2
        cli_plan(args)
    if args.ray:
        return _run_ray(args, settings)
    app = create_app(None, settings)
    threading.Thread(target=_load_engines, args=(args, app.state.qtts), name="qtts-load", daemon=True).start()
    print(f"qtts: serving on http://{args.host}:{args.port} (GET /health turns 200 when the model is loaded)")
    print(f"qtts: web page: {page_url(args.host, args.port)}  (type, pick a voice, hear it while it is generated)",
          flush=True)
    serve_forever(app, args.host, args.port)
    return 0


def _run_ray(args, settings) -> int:
    """``--ray``: deploy replicas of one batched engine each (docs/operations.md, "One machine or a cluster")."""
    import dataclasses

    from ..server.ray_serve import RayConfig, run

    if args.max_concurrency > 1:
        raise InputError("--ray runs one batched engine per replica: use --max-batch, not --max-concurrency")
    if args.aligner:
        raise InputError("--aligner is not passed to Ray replicas: set QTTS_ALIGNER in the replicas' environment")
    autoscale = None
    if args.autoscale:
        low, sep, high = args.autoscale.partition(":")
        if not (sep and low.isdigit() and high.isdigit()):
            raise InputError(f"--autoscale {args.autoscale!r}: give MIN:MAX replicas, e.g. 1:4")
        autoscale = (int(low), int(high))
    skip = {"port", "max_batch", "max_concurrency"}  # host stays: the origin policy names the bound address
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name not in skip}
    plan = cli_plan(args)  # built here, once, before any replica starts: every replica loads this bundle
    plan = plan if isinstance(plan, str) else "torch"
    config = RayConfig(model=args.model, plan=plan, dtype=args.dtype, threads=args.threads,
                       max_batch=args.max_batch or 8, replicas=args.replicas, autoscale=autoscale,
                       num_cpus=args.replica_cpus, settings=fields)  # fmt: skip
    print(f"qtts: Ray Serve on http://{args.host}:{args.port} ({config.replicas if autoscale is None else args.autoscale} "
          f"replica(s), max_batch {config.max_batch} each); Ctrl-C stops it")  # fmt: skip
    run(config, address=args.address, host=args.host, port=args.port, blocking=True)
    return 0


def page_url(host: str, port: int) -> str:
    """The address to open in a browser (a wildcard bind is reached through loopback here)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
