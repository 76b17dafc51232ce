#!/usr/bin/env python3
"""Bounded soak test of the qtts HTTP server: N concurrent streams for a fixed time, loopback only.

Starts a server in this process on a model snapshot (default: a freshly written tiny random
checkpoint) or talks to ``--url`` (127.0.0.1 / ::1 / localhost only). N client threads, each from
an address of its own (127.0.1.K when the server is on 127.0.0.1), send speech requests back to
back until ``--duration`` seconds or ``--max-requests`` are reached.
The mix: wav / pcm / opus streams; every 5th request disconnects after its first chunk; every
7th asks for an unknown voice and must get 404. Anything else that is not a 200 with decodable
audio of the expected length is an error. RSS (psutil) is sampled over time; growth is measured
from the end of the warm-up to the end of the run.

Good clients' time to first audio and real-time factor (request wall time / audio seconds) are
reported as p50/p95. ``--attackers`` adds one hostile client of each kind of the 2026-12-01 and
-04 probes (``benchmarks/soak_attackers*.py``; with a local server also a Wyoming service on its own
engine, its attackers, and a good Wyoming client timing its first audio), each cycling until the
end; an attack whose outcome is not the documented one counts as an error.
``--baseline S`` first runs the same clients for S seconds without attackers, then the attack
phase for ``--duration``: both phases' first audio and RTF p50/p95 are reported, and the soak
fails when an attack-phase p95 passes ``--bound-factor`` times its no-attack p95 (and, with
``--ttfa-bound`` / ``--rtf-bound``, a fixed limit such as issue 25's 0.3 s / 0.9). The attackers'
process runs at ``--attacker-nice`` (19: a real attacker's CPU is its own machine's); the CPU
seconds it and this process used in the attack phase are reported.

Exit status: 0 when there were no errors, RSS grew less than ``--rss-bound-mb`` and every bound
given held; 1 otherwise.

    .venv/bin/python benchmarks/soak.py --duration 60 --streams 8
    .venv/bin/python benchmarks/soak.py --duration 600 --streams 4 --attackers
    .venv/bin/python benchmarks/soak.py --model M --max-batch 4 --capacity 2 --streams 2 \
        --baseline 300 --duration 600 --attackers      # at capacity, with and without attackers
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import json
import os
import sys
import threading
import time
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_local import start_local, wyoming_good_client  # noqa: E402  (a sibling script)

TEXTS = ["Hello there.", "The quick brown fox jumps over the lazy dog.", "Streaming speech, chunk by chunk.",
         "Numbers like 42 and 1999 are fine too.", "短い文です。", "Ein kurzer Satz."]
FORMATS = ["wav", "pcm", "opus"]
#: good client k connects from GOOD_NET + (k + 1): its own address, none of the attackers' 127.0.0.N
GOOD_NET = "127.0.1."


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="snapshot dir (default: write a tiny random CustomVoice checkpoint)")
    p.add_argument("--url", help="soak an already running server (loopback only) instead of starting one")
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for RSS sampling")
    p.add_argument("--streams", type=int, default=8, help="concurrent client streams (default 8)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to run (default 60)")
    p.add_argument("--max-requests", type=int, default=100_000, help="stop after this many requests")
    p.add_argument("--max-frames", type=int, default=12, help="frames per request (default 12 = 0.96 s)")
    p.add_argument("--workers", type=int, default=2, help="server engines/worker slots (default 2)")
    p.add_argument("--max-batch", type=int, default=1,
                   help="> 1: one batched engine serving this many streams at once instead of --workers engines")
    p.add_argument("--capacity", type=int, help="streams served at once (qtts serve --capacity; default every slot)")
    p.add_argument("--plan", help="execution plan of the local engines (qtts.load's plan; default its preset)")
    p.add_argument("--threads", type=int, default=1, help="threads per local engine (default 1)")
    p.add_argument("--baseline", type=float, default=0.0,
                   help="seconds of the same clients without attackers before the attack phase (default 0: none)")
    p.add_argument("--bound-factor", type=float, default=1.5,
                   help="with --baseline: an attack-phase p95 above this times the no-attack p95 fails (default 1.5)")
    p.add_argument("--ttfa-bound", type=float, metavar="S",
                   help="also fail when the last phase's first-audio p95 passes S seconds (issue 25's row: 0.3)")
    p.add_argument("--rtf-bound", type=float, metavar="R",
                   help="also fail when the last phase's RTF p95 passes R (issue 25's row: 0.9)")
    p.add_argument("--attacker-nice", type=int, default=19,
                   help="niceness of the attackers' process (default 19: an attacker's own CPU is its machine's, "
                        "not the server's; 0: the same priority as the server)")
    p.add_argument("--warmup", type=float, default=0.2,
                   help="fraction of the run's wall time before the RSS baseline (default 0.2)")
    p.add_argument("--rss-bound-mb", type=float, default=64.0, help="allowed RSS growth after warm-up (MB)")
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS samples")
    p.add_argument("--attackers", action="store_true", help="add one hostile client of each kind (docstring)")
    p.add_argument("--tracemalloc", type=int, metavar="N", default=0,
                   help="in-process server: trace Python allocations from the warm-up of the last phase and report "
                        "the N source lines holding the most memory once every client has gone (slows the server)")
    p.add_argument("--json", help="write the report as JSON here")
    args = p.parse_args(argv)
    if not 0 <= args.attacker_nice <= 19:
        p.error(f"--attacker-nice {args.attacker_nice}: give 0 (the server's priority) to 19 (the lowest)")
    if args.tracemalloc and args.url:
        p.error("--tracemalloc traces the in-process server; drop --url (or --tracemalloc)")
    return args


def growth_snapshot(top: int, first=None):
    """tracemalloc: the first call starts tracing and returns a snapshot, the second (``first`` = that
    snapshot; taken after the clients and attackers have gone) the ``top`` lines whose memory is still
    held, as "file:line +KiB (+blocks)"."""
    import tracemalloc

    if first is None:
        tracemalloc.start(1)
        return tracemalloc.take_snapshot()
    stats = tracemalloc.take_snapshot().compare_to(first, "lineno")
    tracemalloc.stop()  # the soak may run inside a longer process (the tests)
    return [f"{st.traceback[0].filename}:{st.traceback[0].lineno} {st.size_diff / 1024:+.0f} KiB "
            f"({st.count_diff:+d} blocks)" for st in stats[:top]]  # fmt: skip


def check_loopback(url: str) -> str:
    host = urlparse(url).hostname or ""
    ok = host == "localhost"
    try:
        ok = ok or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not ok:
        raise SystemExit(f"soak: refusing non-loopback host {host!r}; the soak only runs against 127.0.0.1/::1")
    return url.rstrip("/")


class Soak:
    def __init__(self, url: str, args, speaker: str):
        self.url, self.args, self.speaker = url, args, speaker
        self.lock = threading.Lock()
        self.count = 0
        self.stats = {"ok": 0, "disconnected": 0, "rejected_as_expected": 0, "errors": 0}
        self.ttfa: dict[str, list[float]] = {}  # per phase: good clients' seconds to the first audio bytes
        self.rtf: dict[str, list[float]] = {}  # per phase: good clients' request wall time / audio seconds
        self.wy_ttfa: dict[str, list] = {}  # per phase: the good Wyoming client's seconds to first audio (None: failed)
        self.errors: list[str] = []
        self.phase, self.deadline = "run", time.monotonic()
        self.queued: dict[str, dict] = {}  # per phase: admissions that waited, and their mean wait

    def run_phase(self, name: str, seconds: float) -> None:
        """The good clients, back to back for ``seconds`` (their figures filed under ``name``),
        and the server's admission queue meanwhile (every request and live utterance)."""
        self.phase, self.deadline = name, time.monotonic() + seconds
        self.ttfa[name], self.rtf[name], self.wy_ttfa[name] = [], [], []
        before = queue_wait(self.url)
        clients = [threading.Thread(target=self.client_loop, args=(k,)) for k in range(self.args.streams)]
        if getattr(getattr(self.args, "local", None), "wyoming_port", None):  # a good client of the Wyoming service
            clients.append(threading.Thread(target=wyoming_good_client, args=(
                self.args.local.wyoming_port, self.deadline, self.wy_ttfa[name])))
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        after = queue_wait(self.url)
        n, total = after[0] - before[0], after[1] - before[1]
        self.queued[name] = {"queued": int(n), "queue_wait_mean_s": round(total / n, 3) if n else 0.0}

    def next_index(self) -> int | None:
        with self.lock:
            if self.count >= self.args.max_requests or time.monotonic() >= self.deadline:
                return None
            self.count += 1
            return self.count

    def record(self, key: str, error: str | None = None) -> None:
        with self.lock:
            self.stats[key] += 1
            self.errors += [error] if error and len(self.errors) < 20 else []

    def one(self, client, i: int) -> None:
        fmt = FORMATS[i % len(FORMATS)]
        body = {"model": "qtts", "input": TEXTS[i % len(TEXTS)], "voice": self.speaker, "seed": i,
                "response_format": fmt}
        if i % 7 == 0:
            r = client.post("/v1/audio/speech", json={**body, "voice": "no-such-voice"})
            ok = r.status_code == 404 and "error" in r.json()
            return self.record("rejected_as_expected" if ok else "errors", None if ok else f"#{i}: {r.status_code}")
        t0 = time.perf_counter()
        with client.stream("POST", "/v1/audio/speech", json=body) as r:
            if r.status_code != 200:
                return self.record("errors", f"#{i}: status {r.status_code} {r.read()[:200]!r}")
            if i % 5 == 0:
                next(r.iter_raw())
                return self.record("disconnected")
            data, first = b"", None
            for chunk in r.iter_raw():
                first = first or time.perf_counter() - t0
                data += chunk
        wall = time.perf_counter() - t0
        n = self._samples(data, fmt)
        with self.lock:
            self.ttfa[self.phase].append(first or wall)
            self.rtf[self.phase].append(wall / max(n / 24000, 1e-3))
        if fmt != "opus" and n % 1920:
            return self.record("errors", f"#{i}: {n} samples is not whole frames")
        if not 0 < n <= self.args.max_frames * 1920 + 2000:
            return self.record("errors", f"#{i}: {n} samples")
        self.record("ok")

    @staticmethod
    def _samples(data: bytes, fmt: str) -> int:
        import io

        import soundfile as sf

        if fmt == "pcm":
            return len(data) // 2
        with sf.SoundFile(io.BytesIO(data)) as f:
            return len(f.read(dtype="float32"))

    def client_loop(self, k: int) -> None:
        """Good client ``k``: from its own address 127.0.1.(k+1) when the server is on 127.0.0.1 (a
        listener has an address of its own; the server's queue is fair by address)."""
        import httpx

        host = urlparse(self.url).hostname or ""
        transport = httpx.HTTPTransport(local_address=f"{GOOD_NET}{k + 1}") if host.startswith("127.") else None
        with httpx.Client(base_url=self.url, timeout=120, transport=transport) as client:
            while (i := self.next_index()) is not None:
                try:
                    self.one(client, i)
                except Exception as exc:  # any client-side failure is a soak error
                    self.record("errors", f"#{i}: {type(exc).__name__}: {exc}")


def queue_wait(url: str) -> tuple[float, float]:
    """(count, sum) of the server's qtts_queue_wait_seconds: admissions that had to wait."""
    import httpx

    values = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        for key in ("qtts_queue_wait_seconds_count", "qtts_queue_wait_seconds_sum"):
            if line.startswith(key + " "):
                values[key] = float(line.split()[-1])
    return values.get("qtts_queue_wait_seconds_count", 0.0), values.get("qtts_queue_wait_seconds_sum", 0.0)


def drained(url: str, keys: tuple, wait_s: float = 5.0) -> dict:
    """/health once every key in ``keys`` reads 0, or as it reads after ``wait_s`` seconds."""
    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        health = httpx.get(url + "/health", timeout=30).json()
        if not any(health.get(k) for k in keys) or time.monotonic() > deadline:
            return health
        time.sleep(0.1)


def sample_rss(proc, samples: list, stop: threading.Event, t0: float, every: float) -> None:
    while True:
        samples.append((round(time.monotonic() - t0, 1), proc.memory_info().rss / 2**20))
        if stop.wait(every):
            samples.append((round(time.monotonic() - t0, 1), proc.memory_info().rss / 2**20))
            return


def run(args) -> dict:
    import httpx
    import psutil

    if args.url:
        url, stop_server = check_loopback(args.url), (lambda: None)
        speakers = [v["id"] for v in httpx.get(url + "/v1/voices").json()["data"] if v["type"] == "speaker"]
        proc = psutil.Process(args.pid) if args.pid else None
    else:
        url, stop_server, speakers = start_local(args)
        proc = psutil.Process()
    soak = Soak(url, args, speakers[0] if speakers else "vivian")
    samples: list = []
    stop = threading.Event()
    t0 = time.monotonic()
    sampler = threading.Thread(target=sample_rss, args=(proc, samples, stop, t0, args.sample_every)) if proc else None
    if sampler:
        sampler.start()
    if args.baseline > 0:
        soak.run_phase("baseline", args.baseline)
    attack_t0, attackers = time.monotonic() - t0, None
    if args.attackers:
        from soak_attackers import run_process

        local = getattr(args, "local", None)
        host, port = urlparse(url).hostname, urlparse(url).port
        attackers = run_process(host, port, voices_dir=local.app_voices if local else None,
                                wyoming_port=getattr(local, "wyoming_port", None), speaker=soak.speaker,
                                nice=args.attacker_nice)
    cpu0 = psutil.Process().cpu_times()
    traced: dict = {}
    if args.tracemalloc:  # tracing starts after the warm-up of the last phase
        threading.Timer(args.warmup * args.duration, lambda: traced.update(start=growth_snapshot(0))).start()
    soak.run_phase("attack" if args.attackers else "run", args.duration)
    wall = time.monotonic() - t0
    cpu1 = psutil.Process().cpu_times()
    stop.set()
    attacks = {}
    if attackers is not None:
        attacks = attackers()
        for kind in attacks["unexpected_samples"]:
            soak.record("errors", f"attack {kind}: not the documented outcome")
    if sampler:
        sampler.join()
    # a client that hung up leaves its generation to stop at the next frame: slots drain within a
    # frame or two; one still held 5 s after the last client is a leak
    health = drained(url, ("in_flight", "queue_depth"))
    if health.get("in_flight") or health.get("queue_depth"):
        soak.record("errors", f"after the run: in_flight={health.get('in_flight')} queue={health.get('queue_depth')}")
    health = drained(url, ("batch_active", "batch_waiting"))  # a batched engine drops a closed stream at its next step
    if health.get("batch_active") or health.get("batch_waiting"):
        soak.record("errors", f"after the run the batch still holds {health.get('batch_active')} stream(s)")
    grown = None
    if "start" in traced:  # every client and attacker is gone: what is still held since the warm-up
        time.sleep(2.0)
        gc.collect()
        grown = growth_snapshot(args.tracemalloc, traced["start"])
    stop_server()
    after = [rss for t, rss in samples if t >= args.warmup * wall]
    baseline = after[0] if after else (samples[0][1] if samples else None)
    growth = samples[-1][1] - baseline if samples else None
    in_attack = [rss for t, rss in samples if t >= attack_t0 + args.warmup * (wall - attack_t0)]
    report = {"url": url, "streams": args.streams, "duration_s": round(wall, 1), "requests": soak.count,
              **soak.stats, "error_samples": soak.errors, "rss_mb": [(t, round(r, 1)) for t, r in samples],
              "rss_baseline_mb": None if baseline is None else round(baseline, 1),
              "rss_growth_mb": None if growth is None else round(growth, 1), "rss_bound_mb": args.rss_bound_mb,
              "rss_phase_growth_mb": round(in_attack[-1] - in_attack[0], 1) if in_attack else None, **attacks}
    if grown is not None:
        report["tracemalloc_growth"] = grown
    for phase in soak.ttfa:
        prefix = "baseline_" if phase == "baseline" else ""
        report.update(_percentiles(prefix + "ttfa_s", soak.ttfa[phase]), **_percentiles(prefix + "rtf", soak.rtf[phase]))
        report.update({prefix + k: v for k, v in soak.queued[phase].items()})
        wy = soak.wy_ttfa.get(phase, [])
        report.update(_percentiles(prefix + "wyoming_ttfa_s", [t for t in wy if t is not None]))
        report[prefix + "wyoming_failed"] = sum(t is None for t in wy)
    report["bounds"] = _bounds(report, args.bound_factor)
    report["absolute_bounds"] = _absolute_bounds(report, {"ttfa_s": args.ttfa_bound, "rtf": args.rtf_bound})
    report["cpu_s"] = {"this_process": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 1),
                       "attackers": attacks.get("cpu_s"),
                       "available": round((wall - attack_t0) * (os.cpu_count() or 1), 1)}
    return report


def _bounds(report: dict, factor: float) -> dict:
    """{"ttfa_s": ok, "rtf": ok}: the attack phase's p95 within ``factor`` x the baseline's."""
    out = {}
    for name in ("ttfa_s", "rtf"):
        base, now = report.get(f"baseline_{name}_p95"), report.get(f"{name}_p95")
        if base is not None and now is not None:
            out[name] = now <= factor * base
    return out


def _absolute_bounds(report: dict, limits: dict) -> dict:
    """{"ttfa_s": ok, "rtf": ok} for each limit given: the last phase's p95 at most that."""
    return {name: report[f"{name}_p95"] <= limit for name, limit in limits.items()
            if limit is not None and f"{name}_p95" in report}


def _percentiles(name: str, values: list[float]) -> dict:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda q: round(v[min(len(v) - 1, int(q * len(v)))], 3)  # noqa: E731
    return {f"{name}_p50": pick(0.5), f"{name}_p95": pick(0.95)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.url is None:  # the in-process server, as `qtts serve` (MALLOC_ARENA_MAX=16 for glibc's 2-core default)
        from qtts.server.malloc import limit_arenas

        limit_arenas()
    report = run(args)
    if args.json:  # written whole or not at all
        tmp = f"{args.json}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(report, fh, indent=1)
        os.replace(tmp, args.json)
    print(f"soak: {report['requests']} requests in {report['duration_s']} s with {report['streams']} streams: "
          f"ok {report['ok']}, disconnected {report['disconnected']}, "
          f"rejected as expected {report['rejected_as_expected']}, errors {report['errors']}")
    for e in report["error_samples"]:
        print("  error:", e)
    for prefix, what in (("baseline_", "without attackers"), ("", "with attackers" if args.attackers else "")):
        if f"{prefix}ttfa_s_p50" in report:
            label = f" {what}" if what else ""
            print(f"soak: good clients{label}: first audio p50 {report[prefix + 'ttfa_s_p50']} s, p95 "
                  f"{report[prefix + 'ttfa_s_p95']} s; RTF p50 {report[prefix + 'rtf_p50']}, p95 "
                  f"{report[prefix + 'rtf_p95']}; {report[prefix + 'queued']} admissions waited, "
                  f"{report[prefix + 'queue_wait_mean_s']} s on average")
        if f"{prefix}wyoming_ttfa_s_p50" in report:
            print(f"soak: the good Wyoming client{label}: first audio p50 {report[prefix + 'wyoming_ttfa_s_p50']} s, "
                  f"p95 {report[prefix + 'wyoming_ttfa_s_p95']} s, failed {report[prefix + 'wyoming_failed']}")
    if report["bounds"]:
        print(f"soak: attack-phase p95 within {args.bound_factor} x the no-attack p95: {report['bounds']}")
    if report["absolute_bounds"]:
        print(f"soak: last-phase p95 within first audio {args.ttfa_bound} s / RTF {args.rtf_bound}: "
              f"{report['absolute_bounds']}")
    if args.attackers:
        print(f"soak: CPU seconds in the attack phase: {report['cpu_s']}")
    if "attacks" in report:
        print(f"soak: attacks {report['attacks']}, not the documented outcome: {report['unexpected']}")
    if report["rss_mb"]:
        print("soak: RSS MB over time:", " ".join(f"{t}s={r}" for t, r in report["rss_mb"]))
        print(f"soak: RSS growth after warm-up {report['rss_growth_mb']} MB (bound {args.rss_bound_mb} MB); in the "
              f"last phase after its warm-up {report['rss_phase_growth_mb']} MB")
    failed = report["errors"] > 0 or (report["rss_growth_mb"] or 0) > args.rss_bound_mb
    failed = failed or not all(report["bounds"].values()) or not all(report["absolute_bounds"].values())
    for line in report.get("tracemalloc_growth", []):
        print("soak: still held, allocated since the warm-up:", line)
    print("soak: FAIL" if failed else "soak: PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
