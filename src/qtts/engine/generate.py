"""The generation loop: prompt -> codec frames (numpy, backend-agnostic).

One loop of small phase functions, like gpt-fast's ``generate.py``:

1. :func:`embed_prompt` turns a :class:`~qtts.text.prompt.Prompt` into talker input vectors;
2. prefill: one ``backend.talker`` call over the whole prompt -> logits and hidden of the last position;
3. per frame ``s``: :func:`pick_code0` (repetition penalty over generated code-0 ids, EOS blocked
   for the first two frames, control ids 2048..3071 except EOS suppressed, then sampling);
   ``backend.predict_frame`` -> codebooks 1..15; the frame is yielded; the next talker input is
   the sum of the 16 codebook embeddings plus ``trailing_text[s]`` (``tts_pad`` once the text
   is exhausted); one ``backend.talker`` step.

Everything one generation carries between frames is in a :class:`StreamState`, and each phase is
a function over it (:func:`prefill`, :func:`next_code0`, :func:`stop_reason`, :func:`predict`,
:func:`advance`), so a scheduler can step several streams itself; :class:`Generation` is the
one-stream loop over them. :func:`predict_rows` / :func:`advance_rows` are the same phases for a
list of streams (one batched backend call each), :func:`ready` says whether a stream can take its
next talker step, :func:`release` returns its KV state; :mod:`qtts.engine.batching` drives them.

Live text (``TTS.stream_text``): ``StreamState.text`` may hold a text source (a
:class:`qtts.text.live.LiveContext`) instead of the fixed trailing vectors. Its next vector may not exist
yet: :func:`ready` says (non-blocking) whether :func:`advance` can run now, :func:`wait_ready`
blocks until it can (the one-stream loop calls it), and :func:`frame_limit` is the frame budget,
which grows with the text until the text is complete. A scheduler that steps several streams
calls :func:`ready` before :func:`advance` and leaves a stream that is not ready for a later round
(advancing it raises); streams without live text are always ready.

It stops on EOS (the EOS frame is dropped), on the frame budget (``length``), or when the
:class:`Watchdog` sees stuck codes (``runaway``). It can never loop forever: every iteration
either yields a frame that counts against ``max_frames`` or returns.

Randomness: one ``numpy.random.Generator`` seeded per generation; every frame draws 16
uniforms (one for code 0, fifteen for the predictor), sampled or not, so a seed gives the same
codes on every backend that computes the same probabilities (sampling is inverse-CDF).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import BatchBackend
from ..config import NUM_CODEBOOKS
from . import sampling

log = logging.getLogger(__name__)

#: frame budget = BUDGET_BASE + BUDGET_PER_TOKEN * text tokens (12.5 frames per second of audio):
#: 40 frames = 3.2 s of slack, 8 frames = 0.64 s per text token (a spelled-out digit is one token
#: and one word; normal speech needs 2-4 frames per token).
BUDGET_BASE = 40
BUDGET_PER_TOKEN = 8


def frame_budget(num_text_tokens: int, cap: int | None = None) -> int:
    """Max frames for a text of ``num_text_tokens`` target tokens (see the module constants)."""
    budget = BUDGET_BASE + BUDGET_PER_TOKEN * max(0, int(num_text_tokens))
    return budget if cap is None else min(budget, int(cap))


class AnyCancel:
    """A cancel flag that is set when any of ``flags`` (objects with ``is_set()``, or None) is."""

    def __init__(self, *flags):
        self.flags = [f for f in flags if f is not None]

    def is_set(self) -> bool:
        return any(f.is_set() for f in self.flags)


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
    """Everything the loop needs besides the backend and the prompt (build it with :meth:`for_config`)."""

    #: concrete :class:`~qtts.options.SamplingParams` for codebook 0 (talker) and 1..15 (predictor)
    talker: Any
    predictor: Any
    #: frame budget; the loop yields at most this many frames
    max_frames: int
    #: the talker token rules: <tts_pad> text id fed once the trailing text is exhausted; codec
    #: EOS (codebook 0); ids >= suppress_from except EOS are never sampled; EOS is blocked for the
    #: first ``min_frames`` code-0 samples (HF min_new_tokens=2)
    tts_pad_id: int = 151671
    eos_id: int = 2150
    suppress_from: int = 2048
    min_frames: int = 2
    seed: int | None = None
    watchdog: WatchdogParams | None = field(default_factory=WatchdogParams)
    #: an object with ``is_set()`` (e.g. threading.Event); checked before every frame, so a
    #: cancel from another thread stops the loop within one frame (finish_reason 'cancelled')
    cancel: Any = field(default=None, compare=False)

    @classmethod
    def for_config(cls, config, talker, predictor, max_frames: int, **kw) -> LoopParams:
        """The talker token rules of a checkpoint (its <tts_pad>, EOS and control-id range)."""
        return cls(talker=talker, predictor=predictor, max_frames=int(max_frames),
                   tts_pad_id=config.tts_pad_token_id, eos_id=config.talker.codec_eos_token_id,
                   suppress_from=config.talker.vocab_size - 1024, **kw)  # fmt: skip


def pick_code0(logits: np.ndarray, history: list[int], step: int, lp: LoopParams, u: float) -> int:
    """Codebook 0 from talker logits, in the official processor order (see :mod:`qtts.engine.sampling`).

    ``history`` is the code-0 ids generated so far (``step == len(history)``): repetition
    penalty over them, EOS blocked while ``step < min_frames``, ids ``suppress_from..`` except
    EOS suppressed, then temperature/top-k/top-p and an inverse-CDF draw with ``u``.
    """
    rules = sampling.talker_rules(len(logits), lp.eos_id, lp.min_frames, suppress_from=lp.suppress_from)
    return sampling.sample(logits, lp.talker, u, history, rules)


def embed_prompt(backend, prompt, speaker: np.ndarray | None = None) -> np.ndarray:
    """Talker input vectors ``[L, H]`` of a prompt (see the Prompt contract in :mod:`qtts.text.prompt`)."""
    text_ids = np.asarray(prompt.text_ids, dtype=np.int64)
    codec_ids = np.asarray(prompt.codec_ids, dtype=np.int64)
    out = np.zeros((len(text_ids), backend.hidden_size), dtype=np.float32)
    for ids, embeds in ((text_ids, backend.text_embeds), (codec_ids, backend.codec_embeds)):
        if (ids >= 0).any():
            out[ids >= 0] += embeds(ids[ids >= 0])
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


def text_vectors(backend, prompt, tts_pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(trailing text vectors [M, H], the <tts_pad> vector [H]) fed one per frame after the prefill."""
    ids = np.asarray(prompt.trailing_text_ids, dtype=np.int64)
    trailing = backend.text_embeds(ids) if len(ids) else np.zeros((0, backend.hidden_size), np.float32)
    pad = backend.text_embeds(np.asarray([tts_pad_id], dtype=np.int64))[0]
    return np.asarray(trailing, dtype=np.float32), np.asarray(pad, dtype=np.float32)


@dataclass
class StreamState:
    """One generation between frames: everything a scheduler needs to take the next step."""

    kv: Any  # the backend's talker state
    logits: np.ndarray  # talker logits of the last position
    hidden: np.ndarray  # its final-normed hidden state (the predictor's input)
    pos: int  # the next talker position
    trailing: np.ndarray  # [M, H] text vectors, one per frame
    pad: np.ndarray  # [H] the <tts_pad> vector fed after them
    rng: np.random.Generator  # seeded per generation: 16 uniforms per frame
    watchdog: Watchdog | None
    history: list = field(default_factory=list)  # code 0 of every frame so far
    finish_reason: str | None = None
    #: a live text source (ready/wait/vector/frame_limit, see qtts.text.live.LiveContext) that replaces
    #: ``trailing``; None = the prompt's trailing text, then ``pad``
    text: Any = None

    @property
    def frames(self) -> int:
        return len(self.history)


def prefill(backend, prompt, lp: LoopParams, speaker: np.ndarray | None = None, text=None) -> StreamState:
    """Embed the prompt and run it through the talker in one call (``text``: a live text source)."""
    trailing, pad = text_vectors(backend, prompt, lp.tts_pad_id)
    embeds = embed_prompt(backend, prompt, speaker)
    kv = backend.new_state(len(embeds) + lp.max_frames + 1)
    logits, hidden, kv = backend.talker(embeds, 0, kv)
    watchdog = Watchdog(lp.watchdog) if lp.watchdog is not None else None
    return StreamState(kv, logits, hidden, len(embeds), trailing, pad, np.random.default_rng(lp.seed), watchdog,
                       text=text)


def frame_limit(state: StreamState, lp: LoopParams) -> int:
    """The frame budget now: ``lp.max_frames``, or what a live text source allows so far."""
    return lp.max_frames if state.text is None else state.text.frame_limit(lp.max_frames)


def ready(state: StreamState) -> bool:
    """True when :func:`advance` can run without waiting for text (always without live text)."""
    return state.text is None or state.text.ready(state.frames - 1)


def wait_ready(state: StreamState, lp: LoopParams) -> bool:
    """Block until :func:`ready`; False when ``lp.cancel`` (or the text source) cancelled meanwhile."""
    return state.text is None or state.text.wait(state.frames - 1, lp.cancel)


def next_code0(state: StreamState, lp: LoopParams) -> tuple[int, np.ndarray]:
    """Draw the frame's 16 uniforms and pick code 0; returns (code 0, the predictor's 15 uniforms)."""
    u = state.rng.random(NUM_CODEBOOKS)
    return pick_code0(state.logits, state.history, state.frames, lp, float(u[0])), u[1:]


def stop_reason(state: StreamState, code0: int, lp: LoopParams) -> str | None:
    """'eos' or 'length' when this code 0 ends the generation, else None."""
    if code0 == lp.eos_id:
        return "eos"
    return "length" if state.frames >= frame_limit(state, lp) else None


def predict(backend, state: StreamState, code0: int, lp: LoopParams, uniforms: np.ndarray) -> np.ndarray:
    """The whole frame: code 0 + the predictor's codebooks 1..15 -> int64 [16]."""
    state.history.append(int(code0))
    rest = backend.predict_frame(state.hidden, code0, sampling.PredictorSampler(lp.predictor), uniforms)
    return np.concatenate([[code0], np.asarray(rest, dtype=np.int64)]).astype(np.int64)


def text_vector(state: StreamState) -> np.ndarray:
    """The text vector of the next talker step: trailing text, then <tts_pad> (or the live source's)."""
    step = state.frames - 1
    if state.text is not None:
        return state.text.vector(step)
    return state.trailing[step] if step < len(state.trailing) else state.pad


def advance(backend, state: StreamState, codes: np.ndarray) -> None:
    """Feed the frame (+ its trailing text vector, or <tts_pad>) to the talker: one step."""
    x = backend.frame_embeds(codes[None, :])[0] + text_vector(state)
    state.logits, state.hidden, state.kv = backend.talker(x[None, :].astype(np.float32), state.pos, state.kv)
    state.pos += 1


# ----------------------------------------------------------------------------- many streams
def predict_rows(backend, states: list, code0s: list, lps: list, uniforms: list) -> list:
    """:func:`predict` for several streams in one batched predictor frame (``backend.predict_frames``;
    a backend without it runs ``predict_frame`` per stream)."""
    for state, code0 in zip(states, code0s):
        state.history.append(int(code0))
    hidden = np.stack([s.hidden for s in states]).astype(np.float32)
    code0 = np.asarray(code0s, dtype=np.int64)
    samplers = [sampling.PredictorSampler(lp.predictor) for lp in lps]
    if isinstance(backend, BatchBackend):
        rest = backend.predict_frames(hidden, code0, samplers, np.stack(uniforms))
    else:
        rest = [backend.predict_frame(h, int(c), p, u) for h, c, p, u in zip(hidden, code0, samplers, uniforms)]
    return [np.concatenate([[c], np.asarray(r, dtype=np.int64)]).astype(np.int64) for c, r in zip(code0, rest)]


def advance_rows(backend, states: list, frames: list) -> None:
    """:func:`advance` for several streams: one batched talker step, each stream at its own position
    with its own KV state (``backend.talker_rows``; a backend without it steps them one by one)."""
    if not isinstance(backend, BatchBackend):
        for state, codes in zip(states, frames):
            advance(backend, state, codes)
        return
    x = backend.frame_embeds(np.stack(frames)) + np.stack([text_vector(s) for s in states])
    logits, hidden, kvs = backend.talker_rows(x.astype(np.float32), [s.pos for s in states], [s.kv for s in states])
    for i, state in enumerate(states):
        state.logits, state.hidden, state.kv = logits[i], hidden[i], kvs[i]
        state.pos += 1


def release(backend, state: StreamState | None) -> None:
    """Give the stream's talker state back to the backend (a batched backend reuses its KV rows)."""
    if state is not None and isinstance(backend, BatchBackend):
        backend.release(state.kv)


class Generation:
    """One generation: iterate to get frames (np.int64 [16]); then read ``finish_reason``.

    Closing the iterator (or breaking out of a for loop over it) stops the loop at the
    current frame; no further backend call is made.
    """

    def __init__(self, backend, prompt, params: LoopParams, speaker: np.ndarray | None = None, text=None):
        self.backend, self.prompt, self.params, self.speaker = backend, prompt, params, speaker
        self.text = text
        self.state: StreamState | None = None
        self.finish_reason: str | None = None
        self.num_frames = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._frames()

    def waiting(self) -> bool:
        """True when the next step has to wait for text (a live text source that is behind)."""
        return self.state is not None and not ready(self.state)

    def _frames(self) -> Iterator[np.ndarray]:
        self.state = state = prefill(self.backend, self.prompt, self.params, self.speaker, self.text)
        try:
            yield from self._loop(state)
        finally:
            release(self.backend, state)

    def _loop(self, state: StreamState) -> Iterator[np.ndarray]:
        be, lp = self.backend, self.params
        while True:
            if lp.cancel is not None and lp.cancel.is_set():
                self.finish_reason = "cancelled"
                return
            code0, uniforms = next_code0(state, lp)
            self.finish_reason = stop_reason(state, code0, lp)
            if self.finish_reason is not None:
                return
            codes = predict(be, state, code0, lp, uniforms)
            self.num_frames += 1
            yield codes
            if state.watchdog is not None and state.watchdog.update(code0):
                log.warning("generation stopped by the runaway watchdog after %d frames", state.frames)
                self.finish_reason = "runaway"
                return
            if not wait_ready(state, lp):
                self.finish_reason = "cancelled"
                return
            advance(be, state, codes)


def generate(backend, prompt, params: LoopParams, speaker: np.ndarray | None = None, text=None) -> Generation:
    """Start a generation (lazy: nothing runs until it is iterated); ``text``: a live text source."""
    return Generation(backend, prompt, params, speaker, text)
