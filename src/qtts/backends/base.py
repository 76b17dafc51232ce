"""The seams between the engine and a runtime, and what every runtime module gets to build its parts.

A runtime module (``backends/torch.py``, ``onnx.py``, ``rknn.py``, ``qnn.py``) exposes ``OPENERS``:
a dict from part name (``generation``, ``vocoder``, ``speaker_encoder``, ``speech_encoder``) to a
function ``open_part(spec, ctx) -> part`` (``generation`` gets the talker and predictor specs).
:func:`qtts.backends.open` calls them once per loaded model and keeps the parts in
:class:`~qtts.backends.Components`. The parts:

* **generation** (:class:`Backend`, six methods; the loop in :mod:`qtts.engine.generate` drives it).
  ``H`` = talker hidden size, all arrays numpy, embeddings float32:

  - ``text_embeds(ids [n]) -> [n, H]``: ``text_projection(text_embedding(ids))``;
  - ``codec_embeds(ids [n]) -> [n, H]``: rows of the talker ``codec_embedding``;
  - ``frame_embeds(codes [n, 16]) -> [n, H]``: the sum of the 16 codebook embeddings of a frame;
  - ``new_state(max_len)``: a fresh talker KV state for ``max_len`` positions;
  - ``talker(embeds [T, H], pos, state) -> (logits [3072], hidden [H], state)`` of the last position;
  - ``predict_frame(hidden [H], code0, sampler, uniforms [15]) -> codes [15]``: the predictor's 15
    steps of one frame (codebooks 1..15), sampled by the loop's ``sampler``
    (:class:`qtts.engine.sampling.PredictorSampler`: ``pick(logits, u)``, or its ``params`` for a
    graph that samples in-graph); ``uniforms`` keep a fused graph on the loop's seeded random
    stream (see :func:`run_predictor_steps`).
  - :class:`BatchBackend` adds ``talker_rows``, ``predict_frames`` and ``release`` for many streams.
* **vocoder** (:class:`Vocoder`): ``stream()`` gives a fresh stateful :class:`VocoderStream` per
  utterance: ``decode(codes [n, 16]) -> float32 [n * 1920]``, state carried across calls.
* **speaker encoder**: ``embed(wav_24k) -> [enc_dim]`` (x-vector of a Base checkpoint).
* **speech encoder**: ``encode(wav_24k) -> [ceil(N / 1920), 16]`` int64 (ICL reference codes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..config import PREDICTOR_STEPS, ModelConfig


@runtime_checkable
class Backend(Protocol):
    """The generation seam between :mod:`qtts.engine.generate` and a runtime."""

    #: talker hidden size H
    hidden_size: int

    def text_embeds(self, ids: np.ndarray) -> np.ndarray: ...

    def codec_embeds(self, ids: np.ndarray) -> np.ndarray: ...

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray: ...

    def new_state(self, max_len: int) -> Any: ...

    def talker(self, embeds: np.ndarray, pos: int, state: Any) -> tuple[np.ndarray, np.ndarray, Any]: ...

    def predict_frame(self, hidden: np.ndarray, code0: int, sampler: Any, uniforms: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class BatchBackend(Backend, Protocol):
    """A generation backend that steps many streams at once (:mod:`qtts.engine.batching`); the loop
    checks ``isinstance(backend, BatchBackend)`` and otherwise steps the streams one by one."""

    def talker_rows(self, embeds: np.ndarray, positions: list, states: list) -> tuple[np.ndarray, np.ndarray, list]: ...

    def predict_frames(self, hidden: np.ndarray, code0: np.ndarray, samplers: list,
                       uniforms: np.ndarray) -> np.ndarray: ...  # fmt: skip

    def release(self, state: Any) -> None: ...


class VocoderStream(Protocol):
    """One utterance's streaming vocoder: every frame is final when decoded (no flush).

    ``decode`` takes frames int64 ``[n, 16]`` in ``[0, codebook_size)`` and raises InputError on
    others (:func:`qtts.audio.codes.check_codes`, the one check of codes)."""

    samples_per_frame: int

    def reset(self) -> None: ...

    def decode(self, codes: np.ndarray) -> np.ndarray: ...


class Vocoder(Protocol):
    """Built once per model (sessions, modules); ``stream()`` is cheap and per utterance."""

    def stream(self) -> VocoderStream: ...


@dataclass
class OpenContext:
    """What the openers of one :func:`qtts.backends.open` call share."""

    snapshot: str  # the checkpoint directory
    config: ModelConfig
    dtype: str = "float32"  # torch weights of the talker and speaker encoder (the vocoder stays fp32)
    threads: int | None = None  # intra-op threads for every runtime
    #: parts already loaded (e.g. torch modules by checkpoint component), so each loads once
    cache: dict = field(default_factory=dict)
    #: streams one engine steps together (qtts.engine.batching); an onnx plan then opens its batch graphs
    max_batch: int = 1


def run_predictor_steps(step_logits, code0: int, sampler: Any, uniforms: np.ndarray) -> np.ndarray:
    """Drive the 15 predictor steps of one frame from a ``step_logits(j, code)`` callable.

    A backend that runs the predictor one step at a time implements ``predict_frame`` with
    this: ``step_logits(0, code0)`` runs the 2-vector prefill (hidden, code0) and returns the
    logits of ``lm_head[0]`` as numpy ``[2048]``; ``step_logits(j, code_j)`` for j >= 1 feeds
    codebook ``j``'s code at position ``j + 1`` and returns the logits of ``lm_head[j]``.
    Sampling is the loop's ``sampler.pick`` (:class:`qtts.engine.sampling.PredictorSampler`), one
    uniform per step.
    """
    codes = np.zeros(PREDICTOR_STEPS, dtype=np.int64)
    code = int(code0)
    for j in range(PREDICTOR_STEPS):
        code = sampler.pick(step_logits(j, code), float(uniforms[j]))
        codes[j] = code
    return codes


def run_predictor_rows(step_logits, code0: np.ndarray, samplers: list, uniforms: np.ndarray) -> np.ndarray:
    """:func:`run_predictor_steps` for ``B`` streams at once: ``step_logits(j, codes [B])`` returns
    logits ``[B, 2048]``; each row is sampled with its own sampler and uniforms -> codes ``[B, 15]``."""
    rows = len(code0)
    codes = np.zeros((rows, PREDICTOR_STEPS), dtype=np.int64)
    prev = np.asarray(code0, dtype=np.int64)
    for j in range(PREDICTOR_STEPS):
        logits = step_logits(j, prev)
        for b in range(rows):
            codes[b, j] = samplers[b].pick(logits[b], float(uniforms[b, j]))
        prev = codes[:, j]
    return codes
