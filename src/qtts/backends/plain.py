"""The host side of the plain fixed-shape predictor step, shared by the runtimes that run it
(QNN in :mod:`qtts.backends.qnn`, ExecuTorch in :mod:`qtts.backends.executorch`).

The step (:class:`~qtts.export.graphs.PlainPredictorStep`, exported by :mod:`qtts.export.qnn` and
:mod:`qtts.export.executorch`) runs one vector with a 17-slot KV cache in and out; the host feeds
the slot as a one-hot row, the additive mask and which of the 15 heads gives the logits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..config import PREDICTOR_STEPS
from ..errors import InputError

SLOTS = PREDICTOR_STEPS + 2  # the plain predictor step's cache: hidden, code 0, codebooks 1..15
MASK_NEG = -1e4  # finite: fp16 hardware keeps it, softmax underflows it to 0
STEP_INPUTS = ("embeds", "slot", "mask", "head", "kv")
STEP_OUTPUTS = ("logits", "kv_out")


class PlainPredictor:
    """One frame of the predictor over a fixed-shape step (see :mod:`qtts.export.qnn`).

    ``run(embeds, slot, mask, head, kv) -> (logits [1, vocab], kv_out)`` with numpy in and out;
    ``codec_table [V0, H]`` is the talker's codec embedding (code 0), ``tables [15, V, H]`` the
    predictor's; ``kv_shape`` = ``[layers, 2, kv_heads, 17, head_dim]``.
    """

    def __init__(self, run: Callable, codec_table: np.ndarray, tables: np.ndarray, kv_shape: tuple):
        self._run = run
        self.codec_table = np.ascontiguousarray(codec_table, dtype=np.float32)
        self.tables = np.ascontiguousarray(tables, dtype=np.float32)
        self.kv_shape = tuple(int(d) for d in kv_shape)
        if len(self.kv_shape) != 5 or self.kv_shape[3] != SLOTS:
            raise InputError(
                f"predictor step kv must be [layers, 2, kv_heads, {SLOTS}, head_dim], got {kv_shape}"
            )
        self._slots = np.eye(SLOTS, dtype=np.float32)
        self._masks = np.where(np.tri(SLOTS, dtype=bool), 0.0, MASK_NEG).astype(np.float32)

    def step(self, vec: np.ndarray, pos: int, head: int, kv: np.ndarray):
        x = np.ascontiguousarray(vec, dtype=np.float32).reshape(1, 1, -1)
        return self._run(
            x, self._slots[pos : pos + 1], self._masks[pos : pos + 1], np.array([head], np.int64), kv
        )

    def frame_logits(self, hidden: np.ndarray) -> Callable[[int, int], np.ndarray]:
        """A ``step_logits(j, code)`` callable for the loop's ``sampler.frame``
        (:meth:`qtts.engine.generate.PredictorSampler.frame`)."""
        kv = np.zeros(self.kv_shape, np.float32)
        _, kv = self.step(hidden, 0, 0, kv)  # the talker hidden state at slot 0 (its logits unused)

        def step_logits(j: int, code: int) -> np.ndarray:
            nonlocal kv
            vec = self.codec_table[code] if j == 0 else self.tables[j - 1][code]
            logits, kv = self.step(vec, j + 1, j, kv)
            return np.asarray(logits, dtype=np.float32).reshape(-1)

        return step_logits

    def predict_frame(self, hidden, code0: int, sampler, uniforms) -> np.ndarray:
        return sampler.frame(self.frame_logits(hidden), code0, uniforms)

    def predictor_logits(self, hidden, code0: int, sampler, uniforms):
        """(codes [15], logits [15, vocab]) of one frame, for ``qtts verify plan``."""
        step, heads = self.frame_logits(hidden), []

        def logged(j: int, code: int) -> np.ndarray:
            heads.append(step(j, code))
            return heads[-1]

        return sampler.frame(logged, code0, uniforms), np.stack(heads)
