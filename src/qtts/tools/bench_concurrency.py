"""Concurrency benchmark: K streams at once through one batched engine vs K independent engines.

Method (``qtts bench --concurrency 1,2,4,8``): for each level K, rounds alternate between the two
ways a server can run K requests, in one process:

* **batched**: one engine (``qtts.load(..., max_batch=max(2, *levels))``, ``threads`` intra-op threads)
  and K caller threads, each running ``TTS.stream`` (the vocoder steps of all K on the batcher thread);
* **engines**: today's ``qtts serve --max-concurrency K``: K engines, each with ``threads // K``
  intra-op threads (at least 1), one caller thread each.

Every stream speaks the same text for exactly ``frames`` frames (EOS blocked, watchdog off, seed +
stream index), so both ways do the same work. Per round: aggregate throughput = seconds of audio
of all streams / wall seconds of the round; per stream: RTF (its wall time / its audio) and time
to first audio (its ``stream()`` call to its first chunk, vocoder included). Foreign load (cores
used by other processes) is sampled around every round. K engines that would not fit in memory
(K x the first engine's RSS > 80 % of the available memory) are skipped and reported as such.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from .bench import TEXT, bench_voice, busy_jiffies, foreign_cores, rss_mb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConcurrencyOptions:
    #: concurrent streams per level
    levels: tuple = (1, 2, 4, 8)
    #: frames per stream (EOS blocked): 48 = 3.84 s of audio
    frames: int = 48
    #: rounds per level and way (batched and engines alternate)
    repeats: int = 1
    #: intra-op threads of the batched engine; K engines get threads // K each (the server's rule)
    threads: int = 2
    #: also run K independent engines (today's server) for the ratio
    engines: bool = True
    seed: int = 0
    text: str = TEXT


def _bench_tts(parts):
    """A TTS whose generations run exactly their max_frames (EOS blocked, no watchdog)."""
    from ..api import TTS

    tts = TTS(parts)
    tts.synth.exact_frames = True
    return tts


def _one_stream(tts, opts: ConcurrencyOptions, index: int, frames: int, barrier, out: list) -> None:
    from ..options import SynthesisOptions

    options = SynthesisOptions(max_frames=frames, seed=opts.seed + index, split_sentences=False)
    barrier.wait()
    t0 = time.perf_counter()
    first, samples = None, 0
    for chunk in tts.stream(opts.text, options=options, **bench_voice(tts.config)):
        samples += len(chunk.samples)
        if first is None and len(chunk.samples):
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    out[index] = {"ttfa_s": first, "wall_s": wall, "audio_s": samples / 24000.0}


def run_round(engines: list, k: int, opts: ConcurrencyOptions, frames: int | None = None) -> dict:
    """K streams at once; ``engines`` holds one batched TTS (shared) or K TTS (one each)."""
    frames = frames or opts.frames
    out: list = [None] * k
    barrier = threading.Barrier(k + 1)
    threads = [threading.Thread(target=_one_stream, args=(engines[i % len(engines)], opts, i, frames, barrier, out))
               for i in range(k)]  # fmt: skip
    for t in threads:
        t.start()
    jiffies = busy_jiffies()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if any(o is None for o in out):
        raise RuntimeError("a benchmark stream failed (see the log)")
    return {"wall_s": wall, "streams": out, "foreign_cores": foreign_cores(jiffies, busy_jiffies(), wall)}


def _load(model: str, plan, threads: int, max_batch: int = 1):
    from ..backends import open as open_components

    return _bench_tts(open_components(model, plan=plan, threads=threads, max_batch=max_batch))


def _available_mb() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            info = {line.split(":")[0]: float(line.split()[1]) for line in fh}
        return info["MemAvailable"] / 1024.0
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _engines(model: str, plan, k: int, opts: ConcurrencyOptions, one_mb: float) -> list | None:
    """K one-stream engines with threads // K each, or None when they would not fit in memory."""
    avail = _available_mb()
    if avail is not None and k * one_mb > 0.8 * (avail + one_mb):
        log.warning("skipping %d engines: %.0f MB each, %.0f MB available", k, one_mb, avail)
        return None
    engines = [_load(model, plan, max(1, opts.threads // k)) for _ in range(k)]
    for e in engines:
        e.warm()  # every vocoder step size once, as a server before it is ready (qtts.tools.bench.warm_up)
        run_round([e], 1, opts, frames=4)  # warm-up
    return engines


def bench_concurrency(model: str, plan, opts: ConcurrencyOptions, label: str | None = None) -> list:
    """Rows (one per level and way) for ``plan`` (None = torch fp32) on ``model``."""
    levels = tuple(int(k) for k in opts.levels)
    before = rss_mb()
    batched = _load(model, plan, opts.threads, max_batch=max(2, *levels))  # a batched engine even for --concurrency 1
    batched.warm()  # every vocoder step size once, as a server before it is ready
    run_round([batched], 1, opts, frames=4)  # warm-up: sessions, caches, the engine thread
    one_mb = max(rss_mb() - before, 1.0)
    rows = []
    for k in levels:
        engines = _engines(model, plan, k, opts, one_mb) if opts.engines else None
        for _ in range(opts.repeats):
            steps: list = []
            observe = steps.append
            batched.batch.add_observer(observe)
            try:
                rows.append(_summary(label, k, "batched", run_round([batched], k, opts), steps))
            finally:
                batched.batch.remove_observer(observe)
            if engines is not None:
                rows.append(_summary(label, k, "engines", run_round(engines, k, opts)))
        if opts.engines and engines is None:
            rows.append({"label": label, "streams": k, "mode": "engines", "skipped": "memory"})
        del engines
    batched.close()
    return _merge_repeats(rows)


def _summary(label, k: int, mode: str, rnd: dict, steps: list | None = None) -> dict:
    streams = rnd["streams"]
    ttfa = [s["ttfa_s"] for s in streams if s["ttfa_s"] is not None]
    audio = sum(s["audio_s"] for s in streams)
    out = {"label": label, "streams": k, "mode": mode, "aggregate": audio / rnd["wall_s"],
           "rtf": [s["wall_s"] / max(s["audio_s"], 1e-9) for s in streams], "ttfa_s": ttfa,
           "wall_s": [rnd["wall_s"]], "foreign_cores": [rnd["foreign_cores"]]}  # fmt: skip
    if steps:  # the batched engine's steps: full-batch step time, and the prefills that joined
        full = [s.seconds for s in steps if s.rows == k and not s.prefill_s]
        out.update(step_s=full, prefill_s=[s.prefill_s for s in steps if s.prefill_s])
    return out


def _merge_repeats(rows: list) -> list:
    """One row per (level, mode): aggregate = median over rounds, RTF/TTFA percentiles over all streams."""
    merged: dict = {}
    for r in rows:
        key = (r["streams"], r["mode"])
        if "skipped" in r:
            merged[key] = r
            continue
        if key not in merged:
            merged[key] = {**r, "aggregates": [r["aggregate"]]}
            continue
        m = merged[key]
        m["aggregates"].append(r["aggregate"])
        for name in ("rtf", "ttfa_s", "wall_s", "foreign_cores", "step_s", "prefill_s"):
            if name in r:
                m[name] = m[name] + r[name]
    out = []
    for m in merged.values():
        if "skipped" not in m:
            m = dict(m, aggregate=float(np.median(m["aggregates"])), rtf_p50=_pct(m["rtf"], 50),
                     ttfa_p50=_pct(m["ttfa_s"], 50), ttfa_p95=_pct(m["ttfa_s"], 95),
                     foreign=float(np.median(m["foreign_cores"])), step_p50=_pct(m.get("step_s", []), 50),
                     prefill_max=max(m.get("prefill_s") or [0.0]))  # fmt: skip
        out.append(m)
    return out


def _pct(values: list, q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def table_markdown(rows: list) -> str:
    """The concurrency table: per level, batched vs K engines and their throughput ratio."""
    lines = ["| plan | streams | engine | aggregate audio s/s | ratio vs K engines | per-stream RTF p50 "
             "| TTFA p50 s | TTFA p95 s | step s p50 / prefill s max | foreign load (cores) |",
             "|" + "---|" * 10]  # fmt: skip
    by = {(r["label"], r["streams"], r["mode"]): r for r in rows}
    for r in rows:
        name = "1 batched engine" if r["mode"] == "batched" else f"{r['streams']} engine(s)"
        if "skipped" in r:
            lines.append(f"| {r['label']} | {r['streams']} | {name} | skipped ({r['skipped']}) | | | | | | |")
            continue
        other = by.get((r["label"], r["streams"], "engines"))
        ratio = ""
        if r["mode"] == "batched" and other is not None and "skipped" not in other:
            ratio = f"{r['aggregate'] / other['aggregate']:.2f}x"
        steps = f"{r['step_p50']:.2f} / {r['prefill_max']:.2f}" if r.get("step_p50") is not None else ""
        lines.append(f"| {r['label']} | {r['streams']} | {name} | {r['aggregate']:.2f} | {ratio} | "
                     f"{r['rtf_p50']:.2f} | {r['ttfa_p50']:.2f} | {r['ttfa_p95']:.2f} | {steps} | "
                     f"{r['foreign']:.2f} |")  # fmt: skip
    return "\n".join(lines)
