"""The generation loop: prompt -> codec frames (numpy, backend-agnostic), and the sampling it uses.

One loop of small phase functions, like gpt-fast's ``generate.py``. Everything one generation
carries between frames is in a :class:`StreamState`, and each phase is a function over it:
:func:`prefill` (:func:`embed_prompt`, then one ``backend.talker`` call over the whole prompt), then
per frame :func:`next_code0` (:func:`pick_code0` on the talker logits), :func:`stop_reason`,
:func:`predict` (``backend.predict_frame``: codebooks 1..15) and :func:`advance` (the frame's 16
codebook embeddings plus its text vector: one ``backend.talker`` step). :class:`Generation` is the
one-stream loop over them, :mod:`qtts.engine.batching` steps several streams with them, and
:func:`release` returns a stream's KV state.

Live text (``TTS.stream_text``): ``StreamState.text`` may hold a text source (a
:class:`qtts.text.live.LiveContext`) instead of the fixed trailing vectors. Its next vector may not
exist yet: :func:`ready` says so without blocking, :func:`wait_ready` blocks (the one-stream loop),
and :func:`frame_limit` grows with the text. A scheduler leaves a stream that is not ready for a
later round (advancing it raises); streams without live text are always ready.

It stops on EOS (the EOS frame is dropped), on the frame budget (``length``), or when the
:class:`Watchdog` sees stuck codes (``runaway``). It can never loop forever: every iteration
either yields a frame that counts against ``max_frames`` or returns.

Sampling is one implementation for talker and predictor, in the order Hugging Face ``generate``
applies as the official code configures it: repetition penalty -> min-new-tokens EOS block ->
suppressed ids -> temperature -> top-k -> top-p -> softmax -> draw, on float32 copies (greedy skips
the warpers and takes the argmax). Every frame draws 16 uniforms from the generation's seeded
``numpy.random.Generator`` (code 0, then the predictor's fifteen), sampled or not, and a draw is
inverse-CDF over ids in index order: a seed gives the same codes on every backend that computes the
same probabilities.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import BatchBackend
from ..config import NUM_CODEBOOKS, PREDICTOR_STEPS
from ..options import LoopParams, WatchdogParams

log = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------- sampling
@dataclass(frozen=True)
class TokenRules:
    """Model rules on top of sampling params (talker: EOS block and suppressed control ids)."""

    suppress_ids: tuple[int, ...] = ()
    eos_id: int | None = None
    # EOS is impossible while fewer than this many tokens were generated (HF min_new_tokens).
    min_new_tokens: int = 0


@functools.lru_cache(maxsize=8)
def talker_rules(vocab_size: int = 3072, eos_id: int = 2150, min_new_tokens: int = 2,
                 suppress_from: int | None = None) -> TokenRules:  # fmt: skip
    """Official talker rules: codec ids from ``suppress_from`` (default: the last 1024) except EOS are
    suppressed; EOS is blocked while fewer than ``min_new_tokens`` frames were generated."""
    start = vocab_size - 1024 if suppress_from is None else int(suppress_from)
    ids = tuple(i for i in range(start, vocab_size) if i != eos_id)
    return TokenRules(suppress_ids=ids, eos_id=eos_id, min_new_tokens=min_new_tokens)


@dataclass(frozen=True)
class PredictorSampler:
    """How the loop samples the predictor's codes, handed to a backend's ``predict_frame(s)``.

    A backend that computes the predictor step by step hands :meth:`frame` its step function (a
    batched one calls :meth:`pick` per row); a fused graph that samples in-graph reads
    :attr:`params` (temperature, top-k, top-p, do_sample). Either way the sampling rule is the
    loop's: a backend never imports it. No penalty, no suppression (``repetition_penalty`` is 1).
    """

    params: Any

    def pick(self, logits: np.ndarray, u: float) -> int:
        return sample(logits, self.params, u)

    def frame(self, step_logits, code0: int, uniforms: np.ndarray) -> np.ndarray:
        """The 15 predictor codes of one frame (codebooks 1..15) from a backend's ``step_logits(j, code)``:
        ``step_logits(0, code0)`` runs the 2-vector prefill (hidden, code0) and returns the logits of
        ``lm_head[0]`` as numpy ``[2048]``; ``step_logits(j, code_j)`` for j >= 1 feeds codebook ``j``'s
        code at position ``j + 1`` and returns the logits of ``lm_head[j]``. One uniform per step."""
        codes = np.zeros(PREDICTOR_STEPS, dtype=np.int64)
        code = int(code0)
        for j in range(PREDICTOR_STEPS):
            code = self.pick(step_logits(j, code), float(uniforms[j]))
            codes[j] = code
        return codes


def repetition_penalty(scores: np.ndarray, history: Iterable[int], penalty: float) -> np.ndarray:
    """HF RepetitionPenaltyLogitsProcessor: each seen id once; > 0 divided, < 0 multiplied."""
    ids = np.unique(np.fromiter(history, dtype=np.int64))
    if penalty == 1.0 or ids.size == 0:
        return scores
    s = scores[ids]
    scores[ids] = np.where(s < 0, s * np.float32(penalty), s / np.float32(penalty))
    return scores


def top_k_filter(scores: np.ndarray, k: int) -> np.ndarray:
    """HF TopKLogitsWarper: keep ids whose score is >= the k-th largest (ties kept)."""
    k = min(max(int(k), 1), scores.shape[-1])
    kth = np.partition(scores, -k)[-k]
    scores[scores < kth] = -np.inf
    return scores


def top_p_filter(scores: np.ndarray, p: float, min_tokens_to_keep: int = 1) -> np.ndarray:
    """HF TopPLogitsWarper: drop the low tail whose cumulative probability is <= 1 - p.

    Exactly tied scores are ordered by id (stable sort); HF inherits torch's unstable sort
    there, so only exact ties at the cut can differ.
    """
    order = np.argsort(scores, kind="stable")  # ascending, as HF sorts
    cum = np.cumsum(softmax(scores[order]))
    remove = cum <= np.float32(1.0 - p)
    remove[-min_tokens_to_keep:] = False
    scores[order[remove]] = -np.inf
    return scores


def softmax(scores: np.ndarray) -> np.ndarray:
    """Float32 softmax that tolerates -inf entries (at least one finite entry needed)."""
    x = scores.astype(np.float32) - np.max(scores)
    e = np.exp(x)
    return e / e.sum(dtype=np.float32)


def process_logits(logits, params, history: Iterable[int] = (), rules: TokenRules | None = None) -> np.ndarray:
    """Processed float32 scores for ``logits`` [V]; ``params`` is a concrete SamplingParams.

    ``history`` is the ids generated so far in this stream (its length counts for min_new_tokens).
    """
    scores = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
    history = list(history)
    if params.repetition_penalty is not None:
        scores = repetition_penalty(scores, history, float(params.repetition_penalty))
    if rules is not None:
        if rules.eos_id is not None and len(history) < rules.min_new_tokens:
            scores[rules.eos_id] = -np.inf
        if rules.suppress_ids:
            scores[np.asarray(rules.suppress_ids, dtype=np.int64)] = -np.inf
    if not params.do_sample:
        return scores
    if params.temperature is not None and params.temperature != 1.0:
        scores = scores / np.float32(params.temperature)
    if params.top_k:
        scores = top_k_filter(scores, params.top_k)
    if params.top_p is not None and params.top_p < 1.0:
        scores = top_p_filter(scores, params.top_p)
    return scores


def choose(scores: np.ndarray, do_sample: bool, u: float | None = None) -> int:
    """Argmax (greedy) or the id whose probability interval (in id order) contains ``u``."""
    if not do_sample:
        return int(np.argmax(scores))
    cdf = np.cumsum(softmax(scores), dtype=np.float64)
    idx = int(np.searchsorted(cdf, float(u) * cdf[-1], side="right"))
    idx = min(idx, len(cdf) - 1)
    while not np.isfinite(scores[idx]):  # u on a zero-width interval edge: step back to a live id
        idx -= 1
    return idx


def sample(logits, params, rng: np.random.Generator | float, history: Iterable[int] = (),
           rules: TokenRules | None = None) -> int:
    """Process ``logits`` and choose one id; ``rng`` is a Generator or one uniform in [0, 1)."""
    scores = process_logits(logits, params, history, rules)
    u = None
    if params.do_sample:
        u = rng.random() if isinstance(rng, np.random.Generator) else float(rng)
    return choose(scores, params.do_sample, u)


def pick_code0(logits: np.ndarray, history: list[int], step: int, lp: LoopParams, u: float) -> int:
    """Codebook 0 from talker logits, in the official processor order (:func:`process_logits`).

    ``history`` is the code-0 ids generated so far (``step == len(history)``): repetition
    penalty over them, EOS blocked while ``step < min_frames``, ids ``suppress_from..`` except
    EOS suppressed, then temperature/top-k/top-p and an inverse-CDF draw with ``u``.
    """
    rules = talker_rules(len(logits), lp.eos_id, lp.min_frames, suppress_from=lp.suppress_from)
    return sample(logits, lp.talker, u, history, rules)


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
    rest = backend.predict_frame(state.hidden, code0, PredictorSampler(lp.predictor), uniforms)
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
