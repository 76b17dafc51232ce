#!/usr/bin/env python3
"""Streams held: K closed-loop clients against a real ``qtts serve`` over loopback, per transport.

Starts ``python -m qtts serve`` on ``--model`` (or uses ``--url``, loopback only) and, for every
level K of ``--clients`` and every ``--transport`` (pcm: POST /v1/audio/speech streaming raw
16-bit PCM; sse: the same with ``stream_format=sse``; ws: the live-speech WebSocket), runs K
client threads that send requests back to back for ``--duration`` seconds. Per request: RTF =
wall time (send to last byte) / seconds of audio received, first audio = send to the first audio
byte. Per level it prints the per-request RTF p50/p95, first audio p50/p95, requests, errors
(anything but a 200 with audio; 429s are counted apart as ``busy``) and the aggregate seconds of
audio per wall second. The CPU, its core count and the load average are printed with the table.

Real measurement (a quiet machine, >= 5 minutes per level):

    PYTHONPATH=src python benchmarks/capacity.py --model SNAPSHOT --plan BUNDLE/plan.json --max-batch 4 \\
        --clients 1,2,3,4 --duration 300 --frames 64 --transport pcm --transport sse --transport ws

Smoke (a tiny random checkpoint: tests the mechanism, its speed means nothing):

    PYTHONPATH=src python benchmarks/capacity.py --model TINY --clients 1,2 --duration 5 --frames 16
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the woods, "
        "where nobody can find it until the morning comes and the birds begin to sing.")
BYTES_PER_SECOND = 2 * 24000  # 16-bit mono PCM at 24 kHz


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="snapshot dir or bundle for `qtts serve --model`")
    p.add_argument("--plan", help="`qtts serve --plan`")
    p.add_argument("--url", help="measure an already running server (loopback only) instead of starting one")
    p.add_argument("--max-batch", type=int, default=4, help="`qtts serve --max-batch` (default 4)")
    p.add_argument("--capacity", help="`qtts serve --capacity` (N or auto; default: every slot)")
    p.add_argument("--threads", type=int, help="`qtts serve --threads`")
    p.add_argument("--clients", default="1,2,3,4", help="levels: clients at once (default 1,2,3,4)")
    p.add_argument("--transport", action="append", choices=("pcm", "sse", "ws"),
                   help="pcm (default), sse, ws; repeat for several")
    p.add_argument("--duration", type=float, default=300.0, help="seconds per level and transport (default 300)")
    p.add_argument("--frames", type=int, default=64, help="max_frames per request (default 64 = 5.12 s)")
    p.add_argument("--voice", help="speaker or voice id (default: the server's first speaker)")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if not args.url and not args.model:
        p.error("give --model (a server is started) or --url")
    try:
        args.levels = [int(x) for x in args.clients.split(",")]
    except ValueError:
        p.error(f"--clients {args.clients!r}: comma-separated integers")
    if min(args.levels) < 1 or args.frames < 1 or args.duration <= 0:
        p.error("--clients, --frames and --duration must be positive")
    args.transport = args.transport or ["pcm"]
    return args


def check_loopback(url: str) -> str:
    host = urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"capacity: refusing non-loopback host {host!r}")
    return url.rstrip("/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args):
    """(url, process) of a ``qtts serve`` subprocess that answers /health with 200."""
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "qtts", "serve", "--model", args.model, "--port", str(port), "--max-batch",
           str(args.max_batch), "--max-queue", "256", "--max-frames", str(max(args.frames, 2048)), "--no-access-log"]
    for flag, value in (("--plan", args.plan), ("--capacity", args.capacity), ("--threads", args.threads)):
        if value is not None:
            cmd += [flag, str(value)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"capacity: qtts serve exited {proc.returncode}:\n{proc.stderr.read()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return url, proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("capacity: the server did not become ready within 600 s")


def _voice(url: str, voice: str | None) -> str | None:
    import httpx

    if voice:
        return voice
    speakers = httpx.get(url + "/v1/models", timeout=10).json()["data"][0].get("speakers") or []
    return speakers[0] if speakers else None


# ------------------------------------------------------------------------------------------ one request
def _body(args, voice, seed: int, sse: bool) -> dict:
    body = {"model": "qtts", "input": args.text, "response_format": "pcm", "max_frames": args.frames, "seed": seed}
    if voice:
        body["voice"] = voice
    if sse:
        body["stream_format"] = "sse"
    return body


def http_request(client, url: str, body: dict, sse: bool) -> dict:
    """One POST; the audio bytes and when the first of them came."""
    t0 = time.perf_counter()
    first, size = None, 0
    with client.stream("POST", url + "/v1/audio/speech", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": r.read()[:300].decode("utf-8", "replace")}
        if sse:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if event.get("type") == "speech.audio.delta":
                    size += len(base64.b64decode(event["audio"]))
                    first = first if first is not None else time.perf_counter() - t0
                elif event.get("type") == "error":
                    return {"status": 500, "error": json.dumps(event)[:300]}
        else:
            for data in r.iter_raw():
                size += len(data)
                if data and first is None:
                    first = time.perf_counter() - t0
    return {"status": 200, "wall_s": time.perf_counter() - t0, "first_s": first, "audio_s": size / BYTES_PER_SECOND}


def ws_request(url: str, body: dict, source: str | None = None) -> dict:
    """One live-speech WebSocket session: session.update, the text in one delta, text.done
    (from the loopback address ``source`` when given)."""
    from websockets.sync.client import connect

    extra = {"source_address": (source, 0)} if source else {}

    session = {k: body[k] for k in ("response_format", "max_frames", "seed", "voice") if k in body}
    t0 = time.perf_counter()
    first, size = None, 0
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", max_size=None, **extra) as ws:
        ws.send(json.dumps({"type": "session.update", "session": session}))
        ws.send(json.dumps({"type": "text.delta", "delta": body["input"]}))
        ws.send(json.dumps({"type": "text.done"}))
        for message in ws:
            if isinstance(message, bytes):
                size += len(message)
                first = first if first is not None or not message else time.perf_counter() - t0
                continue
            event = json.loads(message)
            if event.get("type") == "audio.done":
                break
            if event.get("type") == "error":
                busy = event.get("error", {}).get("code") in ("queue_full", "busy")
                return {"status": 429 if busy else 500, "error": json.dumps(event)[:300]}
    return {"status": 200, "wall_s": time.perf_counter() - t0, "first_s": first, "audio_s": size / BYTES_PER_SECOND}


# ------------------------------------------------------------------------------------------ one level
def client_address(url: str, index: int) -> str | None:
    """Each client from its own loopback address (127.0.1.N) when the server is on loopback: the
    server's per-address limits (fair queue, WebSocket sessions per client) then see K listeners, as
    K real clients would be; None elsewhere."""
    host = urlparse(url).hostname or ""
    return f"127.0.1.{index + 1}" if host.startswith("127.") else None


def client_loop(args, url: str, voice, transport: str, index: int, until: float, out: list) -> None:
    import httpx

    seed = 1000 * index
    source = client_address(url, index)
    transport_opts = {"transport": httpx.HTTPTransport(local_address=source)} if source else {}
    with httpx.Client(timeout=600, **transport_opts) as client:
        while time.perf_counter() < until:
            seed += 1
            body = _body(args, voice, seed, transport == "sse")
            try:
                res = (ws_request(url, body, source) if transport == "ws"
                       else http_request(client, url, body, transport == "sse"))  # fmt: skip
            except Exception as exc:  # counted as an error of this level
                res = {"status": 0, "error": f"{type(exc).__name__}: {exc}"}
            out.append(res)


def _pct(values: list, q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_level(args, url: str, voice, transport: str, k: int) -> dict:
    out: list = []
    t0 = time.perf_counter()
    until = t0 + args.duration
    threads = [threading.Thread(target=client_loop, args=(args, url, voice, transport, i, until, out))
               for i in range(k)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in out if r["status"] == 200 and r.get("audio_s")]
    rtf = [r["wall_s"] / r["audio_s"] for r in ok]
    first = [r["first_s"] for r in ok if r["first_s"] is not None]
    return {"transport": transport, "clients": k, "requests": len(out), "errors": len(out) - len(ok) - sum(
        r["status"] == 429 for r in out), "busy": sum(r["status"] == 429 for r in out),
        "rtf_p50": _pct(rtf, 0.5), "rtf_p95": _pct(rtf, 0.95), "first_p50_ms": _ms(_pct(first, 0.5)),
        "first_p95_ms": _ms(_pct(first, 0.95)), "audio_s_per_s": sum(r["audio_s"] for r in ok) / wall,
        "wall_s": wall, "error_samples": [r["error"] for r in out if r["status"] not in (200, 429) and "error" in r][:5],
    }  # fmt: skip


def _ms(seconds):
    return None if seconds is None else 1000.0 * seconds


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list) -> str:
    lines = ["| transport | clients | requests | RTF p50 / p95 | first audio p50 / p95 (ms) | errors | busy (429) "
             "| audio s per wall s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['transport']} | {r['clients']} | {r['requests']} | {_fmt(r['rtf_p50'])} / "
                     f"{_fmt(r['rtf_p95'])} | {_fmt(r['first_p50_ms'], '.0f')} / {_fmt(r['first_p95_ms'], '.0f')} | "
                     f"{r['errors']} | {r['busy']} | {r['audio_s_per_s']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"


def main(argv=None) -> int:
    args = parse_args(argv)
    proc = None
    if args.url:
        url = check_loopback(args.url)
    else:
        url, proc = start_server(args)
    try:
        voice = _voice(url, args.voice)
        rows = []
        for transport in args.transport:
            for k in args.levels:
                rows.append(run_level(args, url, voice, transport, k))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
                for sample in rows[-1]["error_samples"]:
                    print("  error:", sample, flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    print(f"\nCPU: {_cpu()}, {os.cpu_count()} cores; load average at the end {os.getloadavg()[0]:.2f}; "
          f"{args.duration:.0f} s per level, max_frames {args.frames}")
    print(table(rows))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"cpu": _cpu(), "args": {k: v for k, v in vars(args).items() if k != "levels"}, "rows": rows},
                      fh, indent=1)
        os.replace(tmp, args.json)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
