"""qtts demo: the whole pipeline on a tiny random checkpoint, stage by stage, in a few seconds."""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

COMMAND = ("demo",)
HELP = "run the whole pipeline on a tiny random-weight checkpoint (no download) and write demo.wav"

SENTENCE = "Hello from qtts. This sentence went through every stage of the pipeline."
REAL_COMMAND = 'qtts say "Hello" --model Qwen/Qwen3-TTS-12Hz-0.6B-Base --ref-audio me.wav -o out.wav'


def add_arguments(p) -> None:
    p.add_argument("-o", "--output", default="demo.wav", help="output WAV (default: ./demo.wav)")
    p.add_argument("--tokenizer", help="a directory with the real Qwen2 vocab.json + merges.txt (default: stand-in)")
    p.add_argument("--text", default=SENTENCE, help="the sentence to synthesize")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for the tiny model)")


class _Stages:
    def __init__(self):
        self.t = time.perf_counter()

    def done(self, what: str) -> None:
        now = time.perf_counter()
        print(f"  {what:<44} {now - self.t:6.2f} s")
        self.t = now


def _reference_audio(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A synthetic 'voice': a vibrato tone with harmonics and noise (24 kHz)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(24000 * seconds)) / 24000.0
    f0 = 140.0 + 15.0 * np.sin(2 * np.pi * 4.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 24000.0
    wav = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + 0.01 * rng.standard_normal(len(t))
    return wav.astype(np.float32)


def run(args) -> int:
    from .. import load
    from ..audio import WavWriter
    from ..options import SynthesisOptions
    from ..random_checkpoint import write_random_checkpoint

    print("qtts demo: tiny RANDOM weights -> the output is noise, not speech.")
    stages = _Stages()
    with tempfile.TemporaryDirectory(prefix="qtts-demo-") as tmp:
        snap = write_random_checkpoint(os.path.join(tmp, "tiny-base"), size="tiny", kind="base",
                                       seed=args.seed, tokenizer_dir=args.tokenizer)
        stages.done("write tiny random checkpoint")
        tts = load(snap, threads=args.threads)
        stages.done("load (config, tokenizer, torch backend)")
        voice = tts.create_voice((_reference_audio(seed=args.seed), 24000), ref_text="A synthetic reference.")
        stages.done(f"create voice (x-vector + {len(voice.ref_codes)} ICL frames)")
        opts = SynthesisOptions(seed=args.seed, max_frames=40)
        last, n_chunks = None, 0
        with WavWriter(args.output) as w:
            for chunk in tts.stream(args.text, voice=voice, options=opts):
                w.write(chunk.samples)
                n_chunks += 1
                last = chunk
        stages.done(f"synthesize streaming ({n_chunks} chunks)")
    i = last.info
    print(f"  frames={i['frames']} audio={i['audio_s']:.2f}s wall={i['wall_s']:.2f}s rtf={i['rtf']:.2f} "
          f"ttfa={i['ttfa_s']:.2f}s finish_reason={last.finish_reason}")
    print(f"wrote {args.output}")
    print("Random weights make noise, not speech. For real speech use a real checkpoint:")
    print(f"  {REAL_COMMAND}")
    return 0
