"""Logits processing and token choice in numpy: one implementation for talker and predictor.

Semantics and order are those of Hugging Face ``generate`` as the official code configures it:
repetition penalty -> min-new-tokens EOS block -> suppressed ids -> temperature -> top-k ->
top-p -> softmax -> draw. Logits are processed as float32 copies; the input is never modified.
Greedy (``do_sample=False``) skips the warpers (temperature/top-k/top-p) and takes the argmax,
like HF. Draws are inverse-CDF over ids in index order, from one uniform number, so any
backend that computes the same probabilities picks the same id for the same uniform.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import PREDICTOR_STEPS


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
