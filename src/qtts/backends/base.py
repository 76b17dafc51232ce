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
    (:class:`qtts.engine.generate.PredictorSampler`: ``pick(logits, u)``, or its ``params`` for a
    graph that samples in-graph); ``uniforms`` keep a fused graph on the loop's seeded random
    stream; a step-by-step backend hands its step function to ``sampler.frame``).
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

from ..config import ModelConfig


@runtime_checkable
class Backend(Protocol):
    """The generation seam between :mod:`qtts.engine.generate` and a runtime. Runtimes subclass it
    explicitly and so get the defaults of its optional members (``thread_safe``)."""

    #: talker hidden size H
    hidden_size: int
    #: True when generations (each with its own state) may run on several threads at once
    #: (:attr:`qtts.TTS.thread_safe`); a backend with shared per-step buffers says False
    thread_safe: bool = False

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

    ``decode`` takes frames int64 ``[n, 16]`` in ``[0, codebook_size)``: the engine's own frames, or
    codes checked where they came in (``TTS.decode_stream``, codes files, voices:
    :func:`qtts.audio.codes.check_codes`, the one check of codes); it does not check them again.
    Streams subclass it explicitly and so get the defaults of ``prime`` and ``close``."""

    samples_per_frame: int

    def reset(self) -> None: ...

    def decode(self, codes: np.ndarray) -> np.ndarray: ...

    def prime(self, codes: np.ndarray) -> np.ndarray:
        """Decode an ICL voice's reference codes, whose audio is thrown away (default: :meth:`decode`;
        a batched stream counts it apart from delivered audio)."""
        return self.decode(codes)

    def close(self) -> None:
        """The utterance is over (a batched stream leaves its batcher); default: nothing to give back."""


class Vocoder(Protocol):
    """Built once per model (sessions, modules); ``stream()`` is cheap and per utterance. Vocoders
    subclass it explicitly and so get the default of ``batches``."""

    #: True when ``run_batch`` steps several streams' fixed-size steps at once, so that a
    #: :class:`~qtts.backends.vocoder_batch.VocoderBatcher` can share it (the step vocoders)
    batches: bool = False

    def stream(self) -> VocoderStream: ...

    def warm(self) -> None:
        """Do now what a first request would otherwise pay for (build steps, pack weights):
        :meth:`qtts.TTS.warm`, which the servers call before they report ready. By default nothing."""


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
    #: which CPU a pipelined stream's threads run on (:class:`qtts.backends.Placement`); None: anywhere
    placement: Any = None
