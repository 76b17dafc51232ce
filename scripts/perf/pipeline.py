#!/usr/bin/env python3
"""Two-core pipeline prototype: generation on the caller's thread, the vocoder on a worker thread.

    PYTHONPATH=src .venv/bin/python scripts/perf/pipeline.py --model /work/ckpt/full06 \
        --plan /work/ckpt/full06-int4/plan.json [--frames 64] [--rounds 3] \
        [--variants serial:2:2:2x8,pipe:1:1:1x8,pipe:2:1:1x8,greedy:1:1:1-8]

A variant is ``mode:gen_threads:voc_threads:schedule``:

* ``serial``   - today's loop (qtts.bench._one_run): decode inline after each chunk;
* ``pipe``     - generation queues fixed chunks (``FxC``: a first chunk of F frames, then C),
  a worker thread decodes them (one chunk behind);
* ``ramp``     - like ``pipe`` with a deterministic growing schedule ``A/B/C/..`` (e.g. ``1/2/4/8``:
  chunks of 1, 2, 4, then 8 frames): the worker is busy early, the output does not depend on
  timing (bit-identical to ``serial`` with the same schedule);
* ``greedy``   - the worker takes *every* frame generated so far (1..C) whenever it is free
  (the first chunk is whatever exists when it starts: 1 frame), so the second core never waits
  for a full chunk.

Sessions: talker/predictor with ``gen_threads`` intra-op threads, the vocoder step (B=1/2/4/8
artifacts, exported once to /work/perf) with ``voc_threads``. Reported per variant (medians,
interleaved rounds): RTF, TTFA (first decoded audio), stall ms (a listener starting at TTFA
waits this long in total for late chunks), foreign load. Every variant's codes and audio are
compared with the first variant's (bit-identical expected for the same seed).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from common import loadavg, wait_quiet  # noqa: E402
from vocoder_variants import LIB, make_factory, variant_path  # noqa: E402

from qtts.bench import BenchOptions, _busy_jiffies, _loop_params, foreign_cores  # noqa: E402
from qtts.decoders import OnnxStepDecoder  # noqa: E402
from qtts.generate import generate  # noqa: E402
from qtts.runtime import Runtime  # noqa: E402
from qtts.verify import _prompt  # noqa: E402

SR = 24000


def stall_ms(events: list, ttfa: float) -> float:
    """Total wait of a listener who starts playing at ``ttfa``: chunk k is due when the audio
    before it has played; late chunks shift the rest of the playback."""
    clock, stall = ttfa, 0.0
    for ready, n in events:
        if ready > clock:
            stall += ready - clock
            clock = ready
        clock += n / SR
    return 1000.0 * stall


def want(schedule, sent: int) -> int:
    """Frames wanted for chunk number ``sent`` (the last size repeats)."""
    return schedule[min(sent, len(schedule) - 1)]


def run_serial(rt, dec, prompt, speaker, lp, schedule):
    events, codes_all, audio = [], [], []
    pending = []
    t0 = time.perf_counter()
    for codes in generate(rt.backend, prompt, lp, speaker):
        pending.append(codes)
        codes_all.append(codes)
        if len(pending) >= want(schedule, len(events)):
            a = dec.decode(np.asarray(pending, dtype=np.int64))
            events.append((time.perf_counter() - t0, len(a)))
            audio.append(a)
            pending = []
    if pending:
        a = dec.decode(np.asarray(pending, dtype=np.int64))
        events.append((time.perf_counter() - t0, len(a)))
        audio.append(a)
    return time.perf_counter() - t0, events, codes_all, audio


def run_pipelined(rt, dec, prompt, speaker, lp, schedule, greedy: bool):
    """Generation here, decoding on a worker; ``greedy``: the worker drains all pending frames."""
    events, codes_all, audio, errors = [], [], [], []
    lock = threading.Condition()
    frames: list = []  # greedy mode: frames not yet taken by the worker
    done = [False]
    q: queue.Queue = queue.Queue()
    t0 = time.perf_counter()

    def decode(batch):
        a = dec.decode(np.asarray(batch, dtype=np.int64))
        events.append((time.perf_counter() - t0, len(a)))
        audio.append(a)

    def worker_fixed():
        try:
            while (item := q.get()) is not None:
                decode(item)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            errors.append(exc)

    def worker_greedy():
        try:
            while True:
                with lock:
                    lock.wait_for(lambda: frames or done[0])
                    if not frames and done[0]:
                        return
                    batch = frames[: schedule[-1]]
                    del frames[: schedule[-1]]
                decode(batch)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    th = threading.Thread(target=worker_greedy if greedy else worker_fixed, daemon=True)
    th.start()
    pending, sent = [], 0
    for codes in generate(rt.backend, prompt, lp, speaker):
        codes_all.append(codes)
        if greedy:
            with lock:
                frames.append(codes)
                lock.notify()
            continue
        pending.append(codes)
        if len(pending) >= want(schedule, sent):
            q.put(pending)
            pending, sent = [], sent + 1
    if greedy:
        with lock:
            done[0] = True
            lock.notify()
    else:
        if pending:
            q.put(pending)
        q.put(None)
    th.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, events, codes_all, audio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/ckpt/full06")
    ap.add_argument("--plan", default="/work/ckpt/full06-int4/plan.json")
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="serial:2:2:2x8,serial:2:2:1x8,pipe:1:1:1x8,pipe:2:1:1x8,greedy:1:1:1-8,greedy:2:1:1-8")
    ap.add_argument("--voc-variant", default="base", help="vocoder graph variant (vocoder_variants.py)")
    ap.add_argument("--max-foreign", type=float, default=None,
                    help="wait for < this many foreign cores before each run and drop runs above 2x it")
    args = ap.parse_args()
    opts = BenchOptions()
    specs = []
    for v in args.variants.split(","):
        mode, gt, vt, sched = v.split(":")
        if "x" in sched:
            schedule = [int(s) for s in sched.split("x")]
        elif "/" in sched:
            schedule = [int(s) for s in sched.split("/")]
        else:
            schedule = [int(s) for s in sched.split("-")]
        specs.append((v, mode, int(gt), int(vt), schedule))
    runtimes, decoders = {}, {}
    custom = "custom" in args.voc_variant
    for name, mode, gt, vt, schedule in specs:
        if gt not in runtimes:
            rt = Runtime.open(args.model, plan=args.plan, threads=gt)
            runtimes[gt] = (rt, *_prompt(rt, opts.text))
        sizes = sorted(set(schedule) | ({1, 2, 4} if mode == "greedy" else set()))
        key = (vt, tuple(sizes))
        if key not in decoders:
            paths = {b: variant_path(args.model, b, args.voc_variant) for b in sizes}
            dec = OnnxStepDecoder(paths[max(sizes)], session_factory=make_factory(vt, custom))
            # more compiled sizes than main/first: add the extra sessions to the schedule
            for b, p in paths.items():
                if b not in dec._sessions:
                    dec._sessions[b] = make_factory(vt, custom)(p)
            dec.sizes = sorted(dec._sessions, reverse=True)
            decoders[key] = dec
    results: dict = {s[0]: [] for s in specs}
    reference = None
    for r in range(args.rounds + 1):  # round 0 = warm-up (+ identity check)
        order = specs if r % 2 == 0 else specs[::-1]  # round 0 forward: the first variant is the reference
        for name, mode, gt, vt, schedule in order:
            rt, prompt, speaker = runtimes[gt]
            sizes = sorted(set(schedule) | ({1, 2, 4} if mode == "greedy" else set()))
            dec = decoders[(vt, tuple(sizes))]
            dec.reset()
            lp = _loop_params(rt, args.frames if r else 16, opts.seed)
            if args.max_foreign is not None and r:
                wait_quiet(args.max_foreign)
            j0 = _busy_jiffies()
            if mode == "serial":
                total, events, codes, audio = run_serial(rt, dec, prompt, speaker, lp, schedule)
            else:
                total, events, codes, audio = run_pipelined(rt, dec, prompt, speaker, lp, schedule,
                                                            mode == "greedy")
            foreign = foreign_cores(j0, _busy_jiffies(), total)
            if r == 0:
                wav = np.concatenate(audio)
                chunks = [n // 1920 for _, n in events]
                if reference is None:
                    reference = (np.asarray(codes), {})
                same_codes = np.array_equal(reference[0], np.asarray(codes))
                ref_wav = reference[1].setdefault(tuple(chunks), (name, wav))  # same chunking -> same audio
                same_audio = same_codes and np.array_equal(ref_wav[1], wav)
                print(f"  identity: {name}: codes == {specs[0][0]}: {same_codes}; audio bit-identical to "
                      f"{ref_wav[0]} (same chunks {chunks}): {same_audio}", flush=True)
                continue
            if args.max_foreign is not None and foreign > 2 * args.max_foreign:
                print(f"  dropped {name}: foreign load {foreign:.2f}", flush=True)
                continue
            ttfa = events[0][0]
            audio_s = sum(n for _, n in events) / SR
            results[name].append((total / audio_s, 1000 * ttfa, stall_ms(events, ttfa), foreign, len(events)))
    print(f"{args.plan}, {args.frames} frames, vocoder variant {args.voc_variant}, loadavg {loadavg()}")
    base = np.median([x[0] for x in results[specs[0][0]]] or [np.nan])
    for name, runs in results.items():
        if not runs:
            print(f"  {name:<18} no run kept")
            continue
        a = np.asarray(runs)
        print(f"  {name:<18} RTF {np.median(a[:, 0]):.3f} (x{np.median(a[:, 0]) / base:.3f})  runs {np.round(a[:, 0], 3)}"
              f"  TTFA {np.median(a[:, 1]):6.0f} ms  stall {np.median(a[:, 2]):6.0f} ms  chunks {int(a[0, 4])}"
              f"  foreign {np.median(a[:, 3]):.2f}")


if __name__ == "__main__":
    _ = LIB
    main()
