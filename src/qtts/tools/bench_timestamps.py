"""``qtts bench --timestamps``: what word timestamps cost, measured on the product's own stream.

Two parts, on one loaded model and one aligner snapshot:

* **the aligner pass** per runtime (``onnx`` fp32 and ``onnx-int8``, and ``torch`` with
  ``--aligner-runtimes``): one alignment of ``seconds`` of the stream's own audio and text, as the
  stream's worker runs it (one intra-op thread), repeated; the median in ms per second of audio;
* **the stream with timestamps off and on**, interleaved runs of :meth:`qtts.TTS.stream` (the same
  call users make; ``TTS.synth.exact_frames``: every piece runs exactly its frames) over a text of
  several pieces: time to first audio, RTF to the last audio chunk, and the time from the last
  audio to the last words (the last piece is aligned after its audio is out).

Random weights give arbitrary word times; the costs are the real ones (the same shapes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from .bench import bench_voice

log = logging.getLogger(__name__)

#: four sentence pieces (max_sentence_chars 60 packs one sentence per piece)
TEXT = ("The quick brown fox jumps over the lazy dog. A second sentence follows it right here. "
        "Then the third one comes along, a little longer. And a fourth one closes the paragraph.")  # fmt: skip
PIECE_CHARS = 60


@dataclass(frozen=True)
class TimestampBenchOptions:
    frames: int = 64  # per stream (split evenly over the pieces)
    repeats: int = 3
    threads: int = 2
    runtimes: tuple = ("onnx", "onnx-int8")


def stream_run(tts, options, voice: dict) -> dict:
    """One stream: first audio, RTF to its last audio, and the wait from the last audio to the last words."""
    t0 = time.perf_counter()
    ttfa = last_audio = None
    samples, words = 0, 0
    last_words = t0
    for chunk in tts.stream(TEXT, options=options, **voice):
        now = time.perf_counter()
        if len(chunk.samples):
            ttfa = now - t0 if ttfa is None else ttfa
            last_audio, samples = now, samples + len(chunk.samples)
        if chunk.words:
            last_words, words = now, words + len(chunk.words)
    audio_s = samples / 24000.0
    return {"ttfa_ms": 1000 * ttfa, "rtf": (last_audio - t0) / audio_s, "audio_s": audio_s, "words": words,
            "words_after_audio_ms": 1000 * max(0.0, last_words - last_audio)}  # fmt: skip


def bench_stream(tts, opts: TimestampBenchOptions) -> dict:
    """Interleaved streams with timestamps off and on; medians per side."""
    from ..options import SynthesisOptions

    pieces = len(tts.synth.pieces(TEXT, SynthesisOptions(max_sentence_chars=PIECE_CHARS)))
    base = SynthesisOptions(max_frames=max(1, opts.frames // pieces), seed=0, max_sentence_chars=PIECE_CHARS)
    voice = bench_voice(tts.config)
    runs: dict = {"off": [], "on": []}
    for side in ("off", "on"):  # warm-up: sessions, the aligner's load
        stream_run(tts, SynthesisOptions(**{**base.__dict__, "timestamps": side == "on", "max_frames": 4}), voice)
    for _ in range(opts.repeats):
        for side in ("off", "on"):
            runs[side].append(stream_run(tts, SynthesisOptions(**{**base.__dict__, "timestamps": side == "on"}), voice))
    return {side: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for side, rs in runs.items()}


def bench_aligner(snapshot: str, audio: np.ndarray, text: str, opts: TimestampBenchOptions) -> list[dict]:
    """ms per second of audio of one aligner pass, per runtime (median of ``repeats`` after a warm-up)."""
    from ..align.runtime import open_aligner

    rows = []
    for runtime in opts.runtimes:
        aligner = open_aligner(snapshot, runtime)
        aligner.align(audio, 24000, text, "english")
        times = []
        for _ in range(opts.repeats):
            t0 = time.perf_counter()
            aligner.align(audio, 24000, text, "english")
            times.append(time.perf_counter() - t0)
        seconds = len(audio) / 24000.0
        rows.append({"runtime": runtime, "audio_s": seconds, "ms": 1000 * float(np.median(times)),
                     "ms_per_audio_s": 1000 * float(np.median(times)) / seconds})  # fmt: skip
        del aligner
    return rows


def bench_timestamps(model: str, plan, aligner: str | None, opts: TimestampBenchOptions) -> dict:
    """Both parts (module doc) on ``model`` with ``plan`` and the aligner snapshot ``aligner``."""
    import qtts

    from ..errors import InputError
    from ..options import SynthesisOptions

    tts = qtts.load(model, plan=plan, threads=opts.threads, aligner=aligner)
    worker = tts.aligner
    if worker is None:
        raise InputError("qtts bench --timestamps needs a forced aligner: pass --aligner DIR (a Qwen3-ForcedAligner "
                         "snapshot, or one made by qtts random-checkpoint DIR --kind forced_aligner --size full)")
    tts.synth.exact_frames = True
    stream = bench_stream(tts, opts)
    piece = tts.synth.pieces(TEXT, SynthesisOptions(max_sentence_chars=PIECE_CHARS))[0]
    audio = tts.synthesize(piece, options=SynthesisOptions(max_frames=opts.frames // 4, seed=0), **bench_voice(tts.config))
    rows = bench_aligner(worker.aligner.config.source_dir, audio.samples, piece, opts)
    tts.close()
    return {"stream": stream, "aligner": rows, "stream_aligner_runtime": worker.runtime}


def table_markdown(result: dict) -> str:
    off, on = result["stream"]["off"], result["stream"]["on"]
    lines = ["| aligner runtime | audio (s) | one pass (ms) | ms per s of audio |", "|---|---|---|---|"]
    lines += [f"| {r['runtime']} | {r['audio_s']:.2f} | {r['ms']:.0f} | {r['ms_per_audio_s']:.0f} |"
              for r in result["aligner"]]  # fmt: skip
    lines += ["", f"| stream ({result['stream_aligner_runtime']} aligner) | first audio (ms) | RTF | words after the "
              "last audio (ms) | words |", "|---|---|---|---|---|"]  # fmt: skip
    for side, r in (("timestamps off", off), ("timestamps on", on)):
        lines.append(f"| {side} | {r['ttfa_ms']:.0f} | {r['rtf']:.3f} | {r['words_after_audio_ms']:.0f} | "
                     f"{r['words']:.0f} |")  # fmt: skip
    return "\n".join(lines)
