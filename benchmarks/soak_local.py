"""The in-process servers of ``benchmarks/soak.py``: the HTTP server under test, on a model snapshot
or a freshly written tiny random CustomVoice checkpoint, and (for the attackers) a Wyoming
service on an engine of its own, warmed up before the soak starts so that its one-time
allocations are not counted as growth of the attack phase."""

from __future__ import annotations

import logging
import os
import tempfile
import threading

log = logging.getLogger("soak")
#: the repository's vendored Qwen2 text tokenizer (tests/data/reference), for the tiny checkpoint
TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "reference",
                         "configs", "text-tokenizer-qwen2")


def start_local(args):
    """(url, stop, speakers) of an in-process server; with ``args.attackers`` also a Wyoming
    service (``args.local.wyoming_port``)."""
    import qtts
    from qtts.server import ServerSettings, create_app
    from qtts.server.runner import ServerThread

    model = args.model
    if model is None:
        from qtts.tools.random_checkpoint import write_random_checkpoint

        out = os.path.join(tempfile.mkdtemp(prefix="qtts-soak-"), "tiny-cv")
        model = write_random_checkpoint(out, size="tiny", kind="custom_voice", layout="0.6b", seed=0,
                                        tokenizer_dir=TOKENIZER)
    if args.max_batch > 1:
        engines = qtts.load(model, plan=args.plan, threads=args.threads, max_batch=args.max_batch)
        slots = {"max_batch": args.max_batch}
    else:
        engines = [qtts.load(model, plan=args.plan, threads=args.threads) for _ in range(args.workers)]
        slots = {"max_concurrency": args.workers}
    settings = ServerSettings(max_queue=4 * args.streams, max_frames=args.max_frames, chunk_frames=4,
                              capacity=args.capacity,
                              access_log=False, voices_dir=tempfile.mkdtemp(prefix="qtts-soak-voices-"), **slots)
    srv = ServerThread(create_app(engines, settings)).start()
    one = engines if args.max_batch > 1 else engines[0]
    stop = srv.stop
    if args.attackers:
        srv.wyoming_port, stop_wyoming = start_wyoming(model, args.max_frames)
        stop = lambda: (stop_wyoming(), srv.stop())  # noqa: E731
    srv.app_voices = settings.voices_dir
    args.local = srv
    return srv.url, stop, one.speakers


def start_wyoming(model: str, max_frames: int):
    """(port, stop) of a Wyoming service on its own engine, on a loop in a thread (for the
    attackers). The engine speaks one sentence of ``max_frames`` first: its first synthesis
    allocates its working memory (hundreds of MB at full size), which would otherwise land in
    the attack phase as a step of RSS that the server under test did not make."""
    import asyncio
    import socket

    import qtts
    from qtts.options import SynthesisOptions
    from qtts.wyoming import WyomingService, WyomingSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = qtts.load(model, threads=1)
    if engine.speakers:  # (a Base checkpoint has no built-in voice to warm up with)
        log.info("soak: warming up the Wyoming attacker's engine")
        engine.synthesize("The Wyoming engine warms up before the soak.", speaker=engine.speakers[0],
                          options=SynthesisOptions(max_frames=max_frames))
    service = WyomingService(engine, WyomingSettings(max_frames=max_frames))
    loop, ready = asyncio.new_event_loop(), threading.Event()
    holder = {}

    def serve():
        asyncio.set_event_loop(loop)
        holder["server"] = loop.run_until_complete(service.start(f"tcp://127.0.0.1:{port}"))
        ready.set()
        loop.run_forever()

    threading.Thread(target=serve, name="soak-wyoming", daemon=True).start()
    ready.wait(60)

    def stop():
        asyncio.run_coroutine_threadsafe(holder["server"].stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)

    return port, stop


def wyoming_good_client(port: int, deadline: float, out: list, source: str = "127.0.1.200") -> None:
    """A good Wyoming client from its own address until ``deadline`` (time.monotonic()): one short
    synthesize after another, each read to audio-stop; its seconds to the first audio-chunk go to
    ``out`` (a failure goes as None)."""
    import json
    import socket
    import time

    line = json.dumps({"type": "synthesize", "data": {"text": "The good Wyoming client speaks."}}).encode() + b"\n"
    while time.monotonic() < deadline:
        t0, first = time.monotonic(), None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as s:
                s.sendall(line)
                f = s.makefile("rb")
                while header := f.readline():
                    event = json.loads(header)
                    f.read(event.get("data_length") or 0)
                    f.read(event.get("payload_length") or 0)
                    if event["type"] == "audio-chunk" and first is None:
                        first = time.monotonic() - t0
                    if event["type"] in ("audio-stop", "error"):
                        break
        except OSError:
            pass
        out.append(first)
        time.sleep(0.2)
