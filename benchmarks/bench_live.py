#!/usr/bin/env python3
"""Live speech latency: stream() vs stream_text() fed by a simulated LLM, side by side in one run.

Per round, alternating so machine load hits every path alike (greedy decoding, one voice):

* ``stream``: ``tts.stream(text)`` in the streaming text layout, no sentence split: call -> first chunk;
* ``live whole``: ``tts.stream_text([text])``: first piece -> first chunk (the live path's own cost);
* ``live N tok/s``: ``tts.stream_text(llm)``, an LLM that emits the text's tokens on a wall-clock
  schedule of N tokens/s: first piece -> first chunk (``chunk.info["text_to_audio_s"]``).

Each time is split at the talker prefill: call (or first text piece) -> prefill starts (the live
path's own wait for a final token: one LLM token interval at best), and prefill -> first chunk
(compute, the same work on every path; noisy on a shared machine).

The timed runs stop after their first chunk; their codes so far must equal stream()'s. A slow LLM
(``--slow``, 3 tokens/s) run to the end (``--max-frames``) shows the talker waiting
(``text_wait_s``) with the same codes as stream().

    .venv/bin/python benchmarks/bench_live.py --model /work/ckpt/full06 --plan /work/ckpt/full06-int4/plan.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import numpy as np

TEXT = ("Sure! Here is a quick summary: the meeting moved to Thursday at 3 pm, and Anna will bring the "
        "slides. Let me know if you need anything else.")


def llm(pieces: list[str], rate: float):
    """Yield ``pieces`` at ``rate`` per second from the first one on (a schedule, not a sleep per pull)."""
    t0 = time.perf_counter()
    for i, piece in enumerate(pieces):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield piece


class PrefillClock:
    """Wraps the generation backend and notes when each prefill (a talker call on > 1 vectors) starts."""

    def __init__(self, inner):
        self.inner, self.starts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def talker(self, embeds, pos, state):
        if len(embeds) > 1:
            self.starts.append(time.perf_counter())
        return self.inner.talker(embeds, pos, state)


class Recorder:
    """Wraps a vocoder and keeps the codes it decodes (to compare runs)."""

    def __init__(self, inner):
        self.inner, self.codes = inner, []

    def stream(self):
        from qtts.backends.base import VocoderStream

        inner, codes = self.inner.stream(), self.codes

        class Stream(VocoderStream):  # the declared seam: prime and close get their defaults
            samples_per_frame = 1920

            def close(self):
                inner.close()

            def reset(self):
                inner.reset()

            def decode(self, c):
                codes.append(np.asarray(c).copy())
                return inner.decode(c)

        return Stream()

    def take(self) -> np.ndarray:
        out = np.concatenate(self.codes) if self.codes else np.zeros((0, 16), np.int64)
        self.codes.clear()
        return out


def first_chunk(chunks, live: bool, clock: PrefillClock) -> tuple[float, float]:
    """(to the prefill, prefill to the first chunk with audio), from the call or the first text piece."""
    t0, clock.starts = time.perf_counter(), []
    for chunk in chunks:
        if len(chunk.samples):
            now = time.perf_counter()
            total = chunk.info["text_to_audio_s"] if live else now - t0
            chunks.close()
            return total - (now - clock.starts[0]), now - clock.starts[0]
    raise RuntimeError("no audio")


def same_start(got: np.ndarray, want: np.ndarray) -> bool:
    n = min(len(got), len(want))
    return n > 0 and np.array_equal(got[:n], want[:n])


def voice_for(tts):
    if tts.model_type != "base":
        return {"speaker": tts.speakers[0]}
    t = np.arange(3 * 24000) / 24000
    ref = (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return {"voice": tts.create_voice(ref, sample_rate=24000)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--plan")
    p.add_argument("--threads", type=int)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rates", type=float, nargs="+", default=[30.0])
    p.add_argument("--slow", type=float, default=3.0, help="tokens/s of the slow LLM run (0 = skip)")
    p.add_argument("--max-frames", type=int, default=64, help="frame budget of the slow run")
    args = p.parse_args()

    import qtts
    from qtts.options import SynthesisOptions

    tts = qtts.load(args.model, plan=args.plan, threads=args.threads)
    rec, clock = Recorder(tts.components.vocoder), PrefillClock(tts.components.backend)
    tts = qtts.TTS(dataclasses.replace(tts.components, vocoder=rec, backend=clock))
    kw = voice_for(tts)
    opts = SynthesisOptions(greedy=True, split_sentences=False, non_streaming_text=False, watchdog=False)
    tok = tts.components.tokenizer
    pieces = [tok.decode([i]) for i in tok.encode(TEXT)]  # what an LLM streams: one token per delta
    load0 = os.getloadavg()
    rows: dict[str, list] = {"stream": [], "live whole": [], **{f"live {r:g} tok/s": [] for r in args.rates}}
    for rnd in range(args.rounds + 1):  # round 0 warms up
        times = {"stream": first_chunk(tts.stream(TEXT, options=opts, **kw), False, clock)}
        want = rec.take()
        times["live whole"] = first_chunk(tts.stream_text([TEXT], options=opts, **kw), True, clock)
        assert same_start(rec.take(), want), "live whole: codes differ from stream()"
        for r in args.rates:
            times[f"live {r:g} tok/s"] = first_chunk(tts.stream_text(llm(pieces, r), options=opts, **kw), True, clock)
            assert same_start(rec.take(), want), f"live {r:g} tok/s: codes differ from stream()"
        if rnd:
            for k, v in times.items():
                rows[k].append(v)
        print(f"round {rnd}: " + "  ".join(f"{k} {1000 * a:.0f}+{1000 * b:.0f} ms" for k, (a, b) in times.items()),
              file=sys.stderr)
    print(f"{len(pieces)} text tokens, {args.rounds} rounds (+1 warm-up); "
          f"load average {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores")
    base = statistics.median(a + b for a, b in rows["stream"]) if args.rounds else 0.0
    for k, v in rows.items() if args.rounds else ():
        med = statistics.median(a + b for a, b in v)
        to_prefill, compute = (statistics.median(x[i] for x in v) for i in (0, 1))
        print(f"  time to first audio, {k:<17} median {1000 * med:6.0f} ms (to prefill {1000 * to_prefill:5.0f}, "
              f"then {1000 * compute:5.0f})   minus stream {1000 * (med - base):+5.0f} ms   ratio {med / base:.2f}")
    if args.slow:
        opts = dataclasses.replace(opts, max_frames=args.max_frames, context_frames=max(64, args.max_frames * 4))
        list(tts.stream(TEXT, options=opts, **kw))
        want = rec.take()
        chunks = list(tts.stream_text(llm(pieces, args.slow), options=opts, **kw))
        same = np.array_equal(rec.take(), want)
        info = chunks[-1].info
        print(f"  slow LLM {args.slow:g} tok/s: codes equal to stream(): {same}; the talker waited "
              f"{info['text_wait_s']:.2f} s in all, {info['frames']} frames, finish {chunks[-1].finish_reason}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
