"""How many real-time streams this machine holds: ``qtts serve --capacity auto``.

:func:`measure_capacity` runs a few seconds of probe streams on the loaded batched engine before
the server takes requests: K = 1, 2, ... streams at once (up to ``max_batch``), each ``frames``
frames of audio with EOS blocked, and keeps the largest K at which every stream's real-time
factor (wall time from its start to its last chunk / its audio) stays at or below ``rtf_limit``.
It stops at the first level that misses the bound or when the time budget is spent. The server
then serves that many streams at once; more wait in the queue (429 + Retry-After past it)
instead of slowing every listener below real time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

PROBE_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


@dataclass(frozen=True)
class ProbeOptions:
    frames: int = 24  # per stream: 1.92 s of audio
    rtf_limit: float = 0.9  # every stream of a level at or below this
    budget_s: float = 20.0  # no level starts after this


def _probe_tts(tts):
    """A TTS over the same parts whose streams run exactly their max_frames (EOS blocked)."""
    from ..api import TTS

    probe = TTS(tts.components, max_batch=tts.max_batch)
    probe.synth.exact_frames = True
    return probe


def _voice(tts) -> dict:
    cfg = tts.config
    if cfg.speakers:
        return {"speaker": cfg.speakers[0]}
    if tts.model_type == "voice_design":
        return {"instruct": "A calm, clear voice."}
    from ..voice import Voice

    dim = cfg.speaker_encoder.enc_dim if cfg.speaker_encoder is not None else cfg.talker.hidden_size
    vec = np.random.default_rng(7).standard_normal(dim).astype(np.float32) * 0.05
    return {"voice": Voice(vec, model_size=cfg.tts_model_size)}


def level_rtfs(tts, k: int, frames: int) -> list:
    """RTF of each of ``k`` streams run at once on ``tts``."""
    from ..options import SynthesisOptions

    out: list = [None] * k
    start = threading.Barrier(k)

    def one(i: int) -> None:
        opts = SynthesisOptions(max_frames=frames, seed=i, split_sentences=False)
        start.wait()
        t0, samples = time.perf_counter(), 0
        for chunk in tts.stream(PROBE_TEXT, options=opts, **_voice(tts)):
            samples += len(chunk.samples)
        out[i] = (time.perf_counter() - t0) / max(samples / 24000.0, 1e-9)

    threads = [threading.Thread(target=one, args=(i,), name=f"qtts-probe-{i}") for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(r is None for r in out):
        raise RuntimeError("a capacity probe stream failed (see the log)")
    return out


def measure_capacity(tts, opts: ProbeOptions | None = None) -> int:
    """The largest number of streams (1..``tts.max_batch``) that stay within ``opts.rtf_limit``."""
    opts = opts or ProbeOptions()
    probe = _probe_tts(tts)
    t0, held = time.perf_counter(), 1
    try:
        level_rtfs(probe, 1, 4)  # warm-up
        for k in range(1, max(1, int(tts.max_batch)) + 1):
            if time.perf_counter() - t0 > opts.budget_s:
                log.warning("capacity probe: time budget spent at %d stream(s)", k)
                break
            worst = max(level_rtfs(probe, k, opts.frames))
            log.warning("capacity probe: %d stream(s) at once, worst RTF %.2f", k, worst)
            if worst > opts.rtf_limit:
                if k == 1:
                    log.warning("capacity probe: even one stream runs at RTF %.2f here (> %.2f): every listener "
                                "will wait for audio; serving one stream at a time. A faster CPU, a smaller "
                                "checkpoint or --plan fastest changes that (docs/operations.md, Capacity)",
                                worst, opts.rtf_limit)  # fmt: skip
                break
            held = k
    finally:
        probe.close()
    return held
