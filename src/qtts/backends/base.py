"""The backend seam: what the generation loop needs from a model runtime.

The loop (:mod:`qtts.generate`) is numpy; a backend (torch, onnxruntime, ...) implements
these six methods and nothing else. Backends never own the loop, never sample code 0 and
never see text. See ``docs/backends.md``.

Shapes (``H`` = talker hidden size, all arrays numpy, embeddings float32):

* ``text_embeds(ids [n]) -> [n, H]``: ``text_projection(text_embedding(ids))``.
* ``codec_embeds(ids [n]) -> [n, H]``: rows of the talker ``codec_embedding`` (control ids,
  CustomVoice speaker rows, codebook-0 codes).
* ``frame_embeds(codes [n, 16]) -> [n, H]``: the sum of the 16 codebook embeddings of each frame
  (talker ``codec_embedding`` for codebook 0, predictor ``codec_embedding[j-1]`` for codebook j).
* ``new_state(max_len) -> state``: a fresh talker KV state able to hold ``max_len`` positions.
* ``talker(embeds [T, H], pos, state) -> (logits [3072] float32, hidden [H], state)``: run ``T``
  vectors at positions ``pos .. pos+T-1``; return the codec-head logits and the final-normed
  hidden state of the **last** position, and the new state (callers use the returned one).
* ``predict_frame(hidden [H], code0, params, uniforms [15]) -> codes [15] int64``: the code
  predictor's 15 steps for one frame (fresh predictor cache every frame, all 16 positions kept),
  codebooks 1..15. ``params`` is the sub-talker :class:`~qtts.options.SamplingParams`;
  ``uniforms`` are pre-drawn U[0,1) numbers, one per step, so that a backend may sample inside
  a fused graph and still follow the loop's seeded random stream (see :func:`sample_residuals`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

NUM_RESIDUAL = 15  # codebooks 1..15 come from the code predictor


@runtime_checkable
class Backend(Protocol):
    """The seam between :mod:`qtts.generate` and a runtime."""

    #: talker hidden size H
    hidden_size: int

    def text_embeds(self, ids: np.ndarray) -> np.ndarray: ...

    def codec_embeds(self, ids: np.ndarray) -> np.ndarray: ...

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray: ...

    def new_state(self, max_len: int) -> Any: ...

    def talker(self, embeds: np.ndarray, pos: int, state: Any) -> tuple[np.ndarray, np.ndarray, Any]: ...

    def predict_frame(self, hidden: np.ndarray, code0: int, params: Any, uniforms: np.ndarray) -> np.ndarray: ...


def sample_residuals(step_logits, code0: int, params: Any, uniforms: np.ndarray) -> np.ndarray:
    """Drive the 15 predictor steps of one frame from a ``step_logits(j, code)`` callable.

    A backend that runs the predictor one step at a time implements ``predict_frame`` with
    this: ``step_logits(0, code0)`` runs the 2-vector prefill (hidden, code0) and returns the
    logits of ``lm_head[0]`` as numpy ``[2048]``; ``step_logits(j, code_j)`` for j >= 1 feeds
    codebook ``j``'s code at position ``j + 1`` and returns the logits of ``lm_head[j]``.
    Sampling is :func:`qtts.generate.pick_residual` (no penalty, no suppression), one
    uniform per step.
    """
    from ..generate import pick_residual

    codes = np.zeros(NUM_RESIDUAL, dtype=np.int64)
    code = int(code0)
    for j in range(NUM_RESIDUAL):
        code = pick_residual(step_logits(j, code), params, float(uniforms[j]))
        codes[j] = code
    return codes
