"""Helpers for the batching tests: requests of several modes, a stream run alone, a scripted batch run."""

from __future__ import annotations

import dataclasses

import numpy as np

from qtts.engine.batching import BatchLoop
from qtts.engine.generate import generate
from qtts.options import LoopParams, SynthesisOptions
from qtts.text.prompt import build_prompt, resolve_mode
from qtts.voice import Voice

TEXTS = [
    "Hello there.",
    "A somewhat longer sentence, so that this prompt has more text tokens than the others do.",
    "Numbers: 1, 2, 3.",
    "Short.",
    "The fifth stream joins late and speaks a medium length line.",
]


@dataclasses.dataclass
class Request:
    name: str
    prompt: object
    params: LoopParams
    speaker: np.ndarray | None


def voices(config, seed: int = 5) -> list:
    """An x-vector voice and an ICL voice (reference codes + text) for a Base checkpoint."""
    rng = np.random.default_rng(seed)
    size = config.tts_model_size
    xvec = Voice(rng.standard_normal(config.talker.hidden_size).astype(np.float32), model_size=size)
    icl = Voice(rng.standard_normal(config.talker.hidden_size).astype(np.float32), model_size=size,
                ref_codes=rng.integers(0, 2048, (12, 16)), ref_text="The reference line.")  # fmt: skip
    return [xvec, icl]


def request(
    parts,
    name: str,
    text: str,
    max_frames: int,
    *,
    voice=None,
    speaker=None,
    instruct=None,
    language=None,
    seed=None,
    greedy=True,
    min_frames: int | None = None,
) -> Request:
    config = parts.config
    opts = SynthesisOptions(greedy=greedy, seed=seed).resolve(config.generation)
    mode = resolve_mode(config, voice, speaker, instruct, language)
    prompt = build_prompt(config, parts.tokenizer, text, mode)
    extra = {} if min_frames is None else {"min_frames": min_frames}
    lp = LoopParams.for_config(config, opts.talker, opts.predictor, max_frames, seed=seed, **extra)
    return Request(name, prompt, lp, mode.xvector)


def alone(backend, req: Request) -> tuple[np.ndarray, str]:
    gen = generate(backend, req.prompt, req.params, speaker=req.speaker)
    frames = list(gen)
    return np.array(frames, dtype=np.int64).reshape(-1, 16), gen.finish_reason


class Sink:
    def __init__(self):
        self.frames, self.end, self.error = [], None, None

    def __call__(self, kind, value):
        if kind == "frame":
            self.frames.append(value)
        elif kind == "end":
            self.end = value
        else:
            self.error = value

    @property
    def codes(self) -> np.ndarray:
        return np.array(self.frames, dtype=np.int64).reshape(-1, 16)


def run_batch(
    backend, schedule: dict, max_batch: int = 4, cancel_at: dict | None = None, max_steps: int = 2000
):
    """``schedule``: step index -> requests joining before that step; ``cancel_at``: step -> names to
    close. Returns (name -> Sink, list of StepStats)."""
    stats = []
    loop = BatchLoop(backend, max_batch=max_batch, observer=stats.append)
    sinks, rows = {}, {}
    last = max(schedule)
    for i in range(max_steps):
        for req in schedule.get(i, []):
            sinks[req.name] = Sink()
            rows[req.name] = loop.add(req.prompt, req.params, req.speaker, sinks[req.name])
        for name in (cancel_at or {}).get(i, []):
            rows[name].closed = True
        if i > last and not loop.busy:
            return sinks, stats
        loop.step()
    raise AssertionError(f"the batch did not finish within {max_steps} steps")
