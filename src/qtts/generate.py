"""The generation loop: prompt -> codec frames (numpy, backend-agnostic).

One loop of small phase functions, like gpt-fast's ``generate.py``:

1. :func:`embed_prompt` turns a :class:`~qtts.prompt.Prompt` into talker input vectors;
2. prefill: one ``backend.talker`` call over the whole prompt -> logits and hidden of the last position;
3. per frame ``s``: :func:`pick_code0` (repetition penalty over generated code-0 ids, EOS blocked
   for the first two frames, control ids 2048..3071 except EOS suppressed, then sampling);
   ``backend.predict_frame`` -> codebooks 1..15; the frame is yielded; the next talker input is
   the sum of the 16 codebook embeddings plus ``trailing_text[s]`` (``tts_pad`` once the text
   is exhausted); one ``backend.talker`` step.

It stops on EOS (the EOS frame is dropped), on the frame budget (``length``), or when the
:class:`Watchdog` sees stuck codes (``runaway``). It can never loop forever: every iteration
either yields a frame that counts against ``max_frames`` or returns.

Randomness: one ``numpy.random.Generator`` seeded per generation; every frame draws 16
uniforms (one for code 0, fifteen for the predictor), sampled or not, so a seed gives the same
codes on every backend that computes the same probabilities (sampling is inverse-CDF).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import sampling

log = logging.getLogger(__name__)

FINISH_REASONS = ("eos", "length", "runaway")

#: frame budget = BUDGET_BASE + BUDGET_PER_TOKEN * text tokens (12.5 frames per second of audio):
#: 40 frames = 3.2 s of slack, 8 frames = 0.64 s per text token (a spelled-out digit is one token
#: and one word; normal speech needs 2-4 frames per token).
BUDGET_BASE = 40
BUDGET_PER_TOKEN = 8


def frame_budget(num_text_tokens: int, cap: int | None = None) -> int:
    """Max frames for a text of ``num_text_tokens`` target tokens (see the module constants)."""
    budget = BUDGET_BASE + BUDGET_PER_TOKEN * max(0, int(num_text_tokens))
    return budget if cap is None else min(budget, int(cap))


@dataclass(frozen=True)
class WatchdogParams:
    """Runaway detector on the codebook-0 stream; ``None`` fields disable that check."""

    #: same code 0 this many frames in a row -> runaway (36 frames = 2.9 s of one code)
    max_repeat: int | None = 36
    #: a cycle of period 2..max_period repeated exactly over the last ``window`` frames -> runaway
    window: int | None = 60
    max_period: int = 8


class Watchdog:
    """Detects a stuck code-0 stream: one code repeated, or a short exact cycle."""

    def __init__(self, params: WatchdogParams):
        self.params = params
        self.history: list[int] = []

    def update(self, code0: int) -> bool:
        """Record a frame's code 0; True when the stream looks stuck."""
        h = self.history
        h.append(int(code0))
        p = self.params
        if p.max_repeat and len(h) >= p.max_repeat and len(set(h[-p.max_repeat :])) == 1:
            return True
        if p.window and len(h) >= p.window + p.max_period:
            tail = np.asarray(h[-(p.window + p.max_period) :])
            recent = tail[p.max_period :]
            for period in range(2, p.max_period + 1):
                if np.array_equal(recent, tail[p.max_period - period : len(tail) - period]):
                    return True
        return False


@dataclass(frozen=True)
class LoopParams:
    """Everything the loop needs besides the backend and the prompt."""

    #: concrete :class:`~qtts.options.SamplingParams` for codebook 0 (talker) and 1..15 (predictor)
    talker: Any
    residual: Any
    #: frame budget; the loop yields at most this many frames
    max_frames: int
    #: text id of <tts_pad>, fed once the trailing text is exhausted
    tts_pad_id: int
    #: codec EOS id (codebook 0), ids >= suppress_from except EOS are never sampled
    eos_id: int = 2150
    suppress_from: int = 2048
    #: EOS is blocked for the first ``min_frames`` code-0 samples (HF min_new_tokens=2)
    min_frames: int = 2
    seed: int | None = None
    watchdog: WatchdogParams | None = field(default_factory=WatchdogParams)
    #: an object with ``is_set()`` (e.g. threading.Event); checked before every frame, so a
    #: cancel from another thread stops the loop within one frame (finish_reason 'cancelled')
    cancel: Any = field(default=None, compare=False)


def pick_code0(logits: np.ndarray, history: list[int], step: int, lp: LoopParams, u: float) -> int:
    """Codebook 0 from talker logits, in the official processor order (see :mod:`qtts.sampling`).

    ``history`` is the code-0 ids generated so far (``step == len(history)``): repetition
    penalty over them, EOS blocked while ``step < min_frames``, ids ``suppress_from..`` except
    EOS suppressed, then temperature/top-k/top-p and an inverse-CDF draw with ``u``.
    """
    rules = _talker_rules(len(logits), lp.eos_id, lp.suppress_from, lp.min_frames)
    return sampling.sample(logits, lp.talker, u, history, rules)


@functools.lru_cache(maxsize=8)
def _talker_rules(vocab: int, eos_id: int, suppress_from: int, min_frames: int) -> sampling.TokenRules:
    ids = tuple(i for i in range(suppress_from, vocab) if i != eos_id)
    return sampling.TokenRules(suppress_ids=ids, eos_id=eos_id, min_new_tokens=min_frames)


def pick_residual(logits: np.ndarray, params: Any, u: float) -> int:
    """One code-predictor code: no penalty, no suppression (``params.repetition_penalty`` is 1)."""
    return sampling.sample(logits, params, u)


def embed_prompt(backend, prompt, speaker: np.ndarray | None = None) -> np.ndarray:
    """Talker input vectors ``[L, H]`` of a prompt (see the Prompt contract in docs/design.md)."""
    text_ids = np.asarray(prompt.text_ids, dtype=np.int64)
    codec_ids = np.asarray(prompt.codec_ids, dtype=np.int64)
    n = len(text_ids)
    out = np.zeros((n, backend.hidden_size), dtype=np.float32)
    has_text = text_ids >= 0
    if has_text.any():
        out[has_text] += backend.text_embeds(text_ids[has_text])
    has_codec = codec_ids >= 0
    if has_codec.any():
        out[has_codec] += backend.codec_embeds(codec_ids[has_codec])
    spk_pos = getattr(prompt, "speaker_pos", None)
    if spk_pos is not None and spk_pos >= 0:
        if speaker is None:
            raise ValueError("prompt has a speaker slot but no speaker vector was given")
        out[spk_pos] += np.asarray(speaker, dtype=np.float32).reshape(-1)
    icl_frame = getattr(prompt, "icl_frame", None)
    if icl_frame is not None and prompt.icl_codes is not None:
        icl_frame = np.asarray(icl_frame, dtype=np.int64)
        rows = icl_frame >= 0
        if rows.any():
            sums = backend.frame_embeds(np.asarray(prompt.icl_codes, dtype=np.int64))
            out[rows] += sums[icl_frame[rows]]
    return out


class Generation:
    """One generation: iterate to get frames (np.int64 [16]); then read ``finish_reason``.

    Closing the iterator (or breaking out of a for loop over it) stops the loop at the
    current frame; no further backend call is made.
    """

    def __init__(self, backend, prompt, params: LoopParams, speaker: np.ndarray | None = None):
        self.backend = backend
        self.prompt = prompt
        self.params = params
        self.speaker = speaker
        self.finish_reason: str | None = None
        self.num_frames = 0
        self.prompt_len = len(prompt.text_ids)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._frames()

    def _text_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        be = self.backend
        trailing_ids = np.asarray(self.prompt.trailing_text_ids, dtype=np.int64)
        trailing = be.text_embeds(trailing_ids) if len(trailing_ids) else np.zeros((0, be.hidden_size), np.float32)
        pad = be.text_embeds(np.asarray([self.params.tts_pad_id], dtype=np.int64))[0]
        return np.asarray(trailing, dtype=np.float32), np.asarray(pad, dtype=np.float32)

    def _prefill(self):
        be, lp = self.backend, self.params
        embeds = embed_prompt(be, self.prompt, self.speaker)
        state = be.new_state(len(embeds) + lp.max_frames + 1)
        logits, hidden, state = be.talker(embeds, 0, state)
        return logits, hidden, state, len(embeds)

    def _frames(self) -> Iterator[np.ndarray]:
        be, lp = self.backend, self.params
        trailing, pad = self._text_vectors()
        logits, hidden, state, pos = self._prefill()
        rng = np.random.default_rng(lp.seed)
        history: list[int] = []
        watchdog = Watchdog(lp.watchdog) if lp.watchdog is not None else None
        step = 0
        while True:
            if lp.cancel is not None and lp.cancel.is_set():
                self.finish_reason = "cancelled"
                return
            u = rng.random(16)
            code0 = pick_code0(logits, history, step, lp, float(u[0]))
            if code0 == lp.eos_id:
                self.finish_reason = "eos"
                return
            if step >= lp.max_frames:
                self.finish_reason = "length"
                return
            history.append(code0)
            residual = be.predict_frame(hidden, code0, lp.residual, u[1:])
            codes = np.concatenate([[code0], np.asarray(residual, dtype=np.int64)]).astype(np.int64)
            self.num_frames += 1
            yield codes
            if watchdog is not None and watchdog.update(code0):
                log.warning("generation stopped by the runaway watchdog after %d frames", step + 1)
                self.finish_reason = "runaway"
                return
            text_vec = trailing[step] if step < len(trailing) else pad
            x = be.frame_embeds(codes[None, :])[0] + text_vec
            logits, hidden, state = be.talker(x[None, :].astype(np.float32), pos, state)
            pos += 1
            step += 1


def generate(backend, prompt, params: LoopParams, speaker: np.ndarray | None = None) -> Generation:
    """Start a generation (lazy: nothing runs until it is iterated)."""
    return Generation(backend, prompt, params, speaker)
