"""``qtts wyoming``: the Wyoming protocol service for Home Assistant (extra ``wyoming``)."""

from __future__ import annotations

import logging
import sys

from .common import add_model, cli_plan, command, number

log = logging.getLogger(__name__)


def register(sub) -> None:
    p = command(sub, "wyoming", run, "serve the Wyoming protocol (Home Assistant's local TTS): "
                "qtts wyoming -m M --uri tcp://0.0.0.0:10200")
    add_model(p)
    p.add_argument("--uri", default="tcp://127.0.0.1:10200",
                   help="where to listen: tcp://HOST:PORT, unix://PATH or stdio:// (default tcp://127.0.0.1:10200)")
    p.add_argument("--voices", metavar="DIR", help="folder of saved .voice files: the voices of a Base checkpoint")
    p.add_argument("--voice", metavar="NAME", help="voice used when a request names none (default: the first)")
    p.add_argument("--language", default="auto",
                   help="language when a request names none: auto (default), a code (en) or a model language")
    p.add_argument("--instruct", metavar="TEXT", help="style instruction for every request (VoiceDesign needs one)")
    p.add_argument("--speed", type=number(float, lo=0.25, hi=4.0), default=1.0,
                   help="speaking rate 0.25-4.0, pitch kept (default 1.0)")
    p.add_argument("--seed", type=number(lo=0), help="seed sampling: the same text always sounds the same")
    p.add_argument("--max-frames", type=number(lo=1), metavar="N",
                   help="frame budget of each text piece (a few sentences; 12.5 frames/s; default: from its length)")
    p.add_argument("--max-request-frames", type=number(lo=1), default=2048, metavar="N",
                   help="frames of one request (or streamed sentence) in all (default 2048 = 164 s, as qtts serve)")
    p.add_argument("--max-chars", type=number(lo=1), default=4096, metavar="N",
                   help="longest text of one request (default 4096)")
    p.add_argument("--no-streaming", action="store_true",
                   help="do not offer streaming synthesis (synthesize-start/-chunk/-stop)")
    p.add_argument("--max-connections", type=number(lo=1), default=16, metavar="N",
                   help="open client connections at most; more get an error event (default 16)")
    p.add_argument("--max-connections-per-client", type=number(lo=1), default=8, metavar="N",
                   help="open connections from one client address (default 8)")
    p.add_argument("--idle-timeout", type=number(float, above=0), default=60.0, metavar="S",
                   help="close a connection that sends nothing for S seconds while nothing is spoken (default 60)")
    p.add_argument("--write-timeout", type=number(float, above=0), default=10.0, metavar="S",
                   help="drop a client that reads nothing for S seconds (default 10)")


def _settings(args):
    from ..wyoming import WyomingSettings

    return WyomingSettings(uri=args.uri, voices_dir=args.voices, voice=args.voice, language=args.language,
                           instruct=args.instruct, speed=args.speed, seed=args.seed, max_frames=args.max_frames,
                           max_chars=args.max_chars, streaming=not args.no_streaming,
                           max_request_frames=args.max_request_frames, max_connections=args.max_connections,
                           max_connections_per_client=args.max_connections_per_client,
                           idle_timeout_s=args.idle_timeout,
                           write_timeout_s=args.write_timeout)


def _check_uri(uri: str) -> None:
    from urllib.parse import urlparse

    from ..errors import InputError

    parsed = urlparse(uri)
    if parsed.scheme not in ("tcp", "unix", "stdio"):
        raise InputError(f"--uri {uri!r}: use tcp://HOST:PORT, unix://PATH or stdio://")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme == "tcp" and (not parsed.hostname or port is None):
        raise InputError(f"--uri {uri!r}: a tcp URI needs a host and a port, e.g. tcp://127.0.0.1:10200")
    if parsed.scheme == "tcp" and parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        log.warning("qtts: the Wyoming service on %s has no authentication; expose it to your home network only",
                    parsed.hostname)


def check_port_free(uri: str) -> None:
    """tcp://HOST:PORT: fail in one line (exit 1) before the model loads when the port cannot be
    bound (another service has it, or the address is not this machine's)."""
    import socket
    from urllib.parse import urlparse

    from ..errors import QttsError

    parsed = urlparse(uri)
    if parsed.scheme != "tcp":
        return
    family = socket.AF_INET6 if ":" in (parsed.hostname or "") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
        try:
            sock.bind((parsed.hostname, parsed.port))
        except OSError as exc:
            raise QttsError(f"cannot listen on {parsed.hostname}:{parsed.port} ({exc.strerror or exc}); "
                            "stop the program that uses it or choose another port in --uri") from None


def run(args) -> int:
    import asyncio

    from .. import load
    from ..errors import require
    from ..wyoming import WyomingService

    require("wyoming", "wyoming", "qtts wyoming")
    from ..server.malloc import limit_arenas

    limit_arenas()  # before any thread starts (qtts.server.malloc)
    _check_uri(args.uri)
    settings = _settings(args)
    from ..plans.cache import plan_label

    check_port_free(args.uri)
    tts = load(args.model, plan=cli_plan(args), dtype=args.dtype, threads=args.threads)
    print(f"qtts: model {args.model} loaded, plan {plan_label(tts.components.plan)}", file=sys.stderr, flush=True)
    service = WyomingService(tts, settings)
    voices = service.catalog.voice_names()
    if not args.uri.startswith("stdio"):  # stdout carries the protocol on stdio://
        print(f"qtts: Wyoming service on {args.uri} ({len(voices)} voice(s): {', '.join(voices[:8])}"
              f"{' ...' if len(voices) > 8 else ''}); add it in Home Assistant: Wyoming Protocol, this host and port",
              flush=True)
    asyncio.run(service.run())
    return 0
